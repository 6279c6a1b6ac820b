"""scripts/trace-chain on a synthetic two-replay trace: a main lane of three kernels (the second started early
under PDL) and a side lane of one, node ids in capture order. A replay is a node's k-th record; costs run from the
lane's previous end; a trace with no graph records and a step past the end are refused."""
import os
import subprocess
import sys

SCRIPT = os.path.join(os.environ.get("TERN_SCRIPTS", os.path.join(os.path.dirname(__file__), "../../scripts")),
                      "trace-chain")


def write(path, rows):
    with open(path, "w") as f:
        f.write("# session: %d records (kernel, start ns, end ns, stream, graph node)\n" % len(rows))
        for r in rows:
            f.write("\t".join(str(x) for x in r) + "\n")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def replay(t):
    # main lane (stream 7): a 0-10 us, b 8-30 us (PDL: started 2 us early), d 35-40 us (after the join);
    # side lane (stream 9): c 12-33 us.
    return [("a_kernel", t + 0, t + 10_000, 7, 101), ("b_kernel", t + 8_000, t + 30_000, 7, 102),
            ("c_kernel", t + 12_000, t + 33_000, 9, 103), ("d_kernel", t + 35_000, t + 40_000, 7, 104)]


def test_costs_from_the_lanes_previous_end(tmp_path):
    trace = tmp_path / "t.tsv"
    write(trace, [("eager_kernel", 0, 500, 7, 0)] + replay(1_000) + replay(100_000))
    out = run(str(trace), "--session", "1", "--step", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("replay 2 of 2: 4 kernels on 2 lanes, 40.0 us")
    rows = [l for l in lines if l.startswith("| ") and "kernel" in l and not l.startswith("| at")]
    names = [r.split("|")[3].strip() for r in rows]
    assert names == ["a_kernel", "b_kernel", "c_kernel", "d_kernel"]
    cost = {r.split("|")[3].strip(): float(r.split("|")[5]) for r in rows}
    gap = {r.split("|")[3].strip(): float(r.split("|")[6]) for r in rows}
    assert cost == {"a_kernel": 10.0, "b_kernel": 20.0, "c_kernel": 21.0, "d_kernel": 10.0}
    assert gap["b_kernel"] == -2.0 and gap["d_kernel"] == 5.0
    assert "main lane: 40.0 us of costs" in out.stdout


def test_first_and_count(tmp_path):
    trace = tmp_path / "t.tsv"
    write(trace, replay(0) + replay(50_000))
    out = run(str(trace), "--session", "1", "--step", "1", "--first", "b_", "--count", "2", "--top", "0")
    assert out.returncode == 0, out.stderr
    rows = [l for l in out.stdout.splitlines() if l.startswith("| ") and not l.startswith("| at")]
    assert [r.split("|")[3].strip() for r in rows] == ["b_kernel", "c_kernel"]


def test_refusals(tmp_path):
    trace = tmp_path / "t.tsv"
    write(trace, [("eager_kernel", 0, 500, 7, 0)])
    assert "no graph replay" in run(str(trace), "--session", "1").stderr
    write(trace, replay(0))
    assert "holds 1 replays, not 3" in run(str(trace), "--session", "1", "--step", "3").stderr
    assert "has 1 sessions, not 2" in run(str(trace)).stderr
