"""scripts/trace-chain on a synthetic two-replay trace with its graph's edges: a -> b -> d, and a -> (an unrecorded
event node) -> c -> d, node ids in capture order; b started early under PDL. The critical path runs from the step's
last-ending kernel back through each kernel's last-ending recorded predecessor (through unrecorded nodes); a replay
is a node's k-th record; a trace without edges for the step, with no graph records, and a step past the end are
refused."""
import os
import subprocess
import sys

SCRIPT = os.path.join(os.environ.get("TERN_SCRIPTS", os.path.join(os.path.dirname(__file__), "../../scripts")),
                      "trace-chain")
EDGES = [(101, 102, 1), (102, 104, 0), (101, 200, 0), (200, 103, 0), (103, 104, 1)]  # (from, to, type)


def write(path, rows, edges=EDGES):
    with open(path, "w") as f:
        if edges:
            f.write("# graph: %d edges (from graph node, to graph node)\n" % len(edges))
            for e in edges:
                f.write("edge\t" + "\t".join(str(x) for x in e) + "\n")
        f.write("# session: %d records (kernel, start ns, end ns, stream, graph node)\n" % len(rows))
        for r in rows:
            f.write("\t".join(str(x) for x in r) + "\n")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def replay(t):
    # a 0-10 us, b 8-30 us (PDL: started 2 us before a ended), c 12-33 us, d 35-40 us; streams as a replay has them
    # (not one a branch).
    return [("a_kernel", t + 0, t + 10_000, 7, 101), ("b_kernel", t + 8_000, t + 30_000, 31, 102),
            ("c_kernel", t + 12_000, t + 33_000, 9, 103), ("d_kernel", t + 35_000, t + 40_000, 44, 104)]


def table(out):
    rows = [l for l in out.stdout.splitlines() if l.startswith("| ") and not l.startswith("| at")]
    return {r.split("|")[2].strip(): (float(r.split("|")[4]), float(r.split("|")[5])) for r in rows}, \
        [r.split("|")[2].strip() for r in rows]


def test_critical_path_through_the_last_ending_predecessor(tmp_path):
    trace = tmp_path / "t.tsv"
    write(trace, [("eager_kernel", 0, 500, 7, 0)] + replay(1_000) + replay(100_000))
    out = run(str(trace), "--session", "1", "--step", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("replay 2 of 2: 4 kernels, 40.0 us")
    costs, names = table(out)
    assert names == ["a_kernel", "c_kernel", "d_kernel"]  # b ended before c: off the path
    assert costs == {"a_kernel": (10.0, 0.0), "c_kernel": (23.0, 2.0), "d_kernel": (7.0, 2.0)}
    assert "critical path: 40.0 us of costs" in out.stdout


def test_all_in_node_order(tmp_path):
    trace = tmp_path / "t.tsv"
    write(trace, replay(0) + replay(50_000))
    out = run(str(trace), "--session", "1", "--step", "1", "--all", "--top", "0")
    assert out.returncode == 0, out.stderr
    costs, names = table(out)
    assert names == ["a_kernel", "b_kernel", "c_kernel", "d_kernel"]
    assert costs["b_kernel"] == (20.0, -2.0)  # from a's end; started 2 us before it
    out = run(str(trace), "--session", "1", "--step", "1", "--all", "--first", "b_", "--count", "2", "--top", "0")
    assert table(out)[1] == ["b_kernel", "c_kernel"]


def test_refusals(tmp_path):
    trace = tmp_path / "t.tsv"
    write(trace, [("eager_kernel", 0, 500, 7, 0)])
    assert "no graph replay" in run(str(trace), "--session", "1").stderr
    write(trace, replay(0))
    assert "holds 1 replays, not 3" in run(str(trace), "--session", "1", "--step", "3").stderr
    assert "has 1 sessions, not 2" in run(str(trace)).stderr
    write(trace, replay(0), edges=[])
    assert "has an edge" in run(str(trace), "--session", "1", "--step", "1").stderr
    write(trace, replay(0), edges=[(1, 2)])
    assert "has an edge" in run(str(trace), "--session", "1", "--step", "1").stderr
    with open(trace, "w") as f:  # the profiler could not read the graph's edges: said, and passed on
        f.write("# graph: edges unavailable: cudaGraphGetEdges: lossy query\n")
        f.write("# session: 4 records (kernel, start ns, end ns, stream, graph node)\n")
        for r in replay(0):
            f.write("\t".join(str(x) for x in r) + "\n")
    err = run(str(trace), "--session", "1", "--step", "1").stderr
    assert "has an edge" in err and "edges unavailable: cudaGraphGetEdges: lossy query" in err
