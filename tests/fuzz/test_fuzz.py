"""Bounded fuzz run of `tern serve` and `tern route` (issue #16), every CI run, in a fixed time.

hypothesis (a PyPI fuzzing and property-testing tool) generates whole HTTP requests: request lines
(methods, origin and absolute targets, HTTP versions), headers (Content-Length right, wrong, repeated,
Transfer-Encoding codings, Expect, Authorization schemes, oversized and malformed lines), bodies framed
by length or in chunks (with bad sizes), and the JSON inside them: OpenAI requests whose fields are
replaced, dropped or nested by random JSON, and bodies nested far deeper than any stack. Each input goes
over a fresh loopback connection; the process must stay up and never answer 500 (500 is for bugs).

TERN_FUZZ_SECONDS (default 90) is split between the server and the router. The run prints each target's
inputs tried and time taken (and writes them to TERN_FUZZ_SUMMARY, which scripts/test prints). A crash or a 500 fails the run and prints the input as a bytes literal, to be
added to regressions.py, which is replayed first on every run.
"""
import json
import os
import re
import socket
import sys
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "router"))
from cluster import route, serve  # noqa: E402

from regressions import CASES, KEY  # noqa: E402

BUDGET = float(os.environ.get("TERN_FUZZ_SECONDS", "90"))
BATCH = 100  # examples per hypothesis run; runs repeat until the time is spent


# --- JSON ---

scalars = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=False) |
           st.text(max_size=12) | st.sampled_from(["user", "assistant", "tool", "text", "function", "auto", ""]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) |
                      st.dictionaries(st.text(max_size=8) | st.sampled_from(["type", "text", "name", "role"]), inner,
                                      max_size=4), max_leaves=16)

FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p", "top_k",
          "min_p", "seed", "stop", "stop_token_ids", "stream", "stream_options", "logprobs", "top_logprobs", "user",
          "tools", "tool_choice", "response_format", "logit_bias", "chat_template_kwargs", "reasoning_effort",
          "metadata", "echo", "suffix", "best_of", "ignore_eos", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "tokens", "add_special_tokens", "parallel_tool_calls"]

message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"])},
                                optional={"content": values | st.text(max_size=30), "name": values,
                                          "tool_call_id": values, "reasoning_content": values,
                                          "tool_calls": st.lists(st.fixed_dictionaries(
                                              {"id": values, "type": st.just("function"),
                                               "function": st.fixed_dictionaries({"name": st.text(max_size=8)},
                                                                                 optional={"arguments": values | st.text()})}),
                                              max_size=2)})
tool = st.fixed_dictionaries({"type": st.sampled_from(["function", "x"]),
                              "function": st.fixed_dictionaries({"name": st.text(max_size=70)},
                                                                optional={"description": values, "parameters": values})})
TEMPLATES = {
    "/v1/chat/completions": st.fixed_dictionaries({"messages": st.lists(message, min_size=1, max_size=3),
                                                   "max_tokens": st.integers(1, 4)},
                                                  optional={"tools": st.lists(tool, max_size=2), "stream": st.booleans(),
                                                            "n": st.integers(1, 3)}),
    "/v1/completions": st.fixed_dictionaries({"prompt": st.text(max_size=20) | st.lists(st.integers(0, 129279), max_size=8),
                                              "max_tokens": st.integers(1, 4)},
                                             optional={"stream": st.booleans(), "logprobs": st.integers(0, 3)}),
    "/tokenize": st.fixed_dictionaries({"prompt": st.text(max_size=20)}),
    "/detokenize": st.fixed_dictionaries({"tokens": st.lists(st.integers(-5, 130000), max_size=8)}),
}
PATHS = list(TEMPLATES) + ["/v1/models", "/health", "/metrics", "/pd/info", "/", "/v1/embeddings", "*"]

DEEP = "\x00DEEP\x00"  # where a nest far deeper than any stack goes


@st.composite
def json_body(draw, path):
    """An OpenAI request for `path` with fields replaced, dropped or nested deep, as JSON text."""
    body = draw(TEMPLATES.get(path, TEMPLATES["/v1/completions"]))
    for _ in range(draw(st.integers(0, 3))):
        field = draw(st.sampled_from(FIELDS))
        action = draw(st.sampled_from(["set", "set", "drop", "deep"]))
        if action == "set":
            body[field] = draw(values)
        elif action == "drop":
            body.pop(field, None)
        else:
            body[field] = DEEP
    text = json.dumps(body)
    if DEEP in text:
        depth = draw(st.sampled_from([63, 64, 65, 1000, 100000]))
        opener = draw(st.sampled_from(["[", '{"a":']))
        closer = "]" if opener == "[" else "}"
        text = text.replace(json.dumps(DEEP), opener * depth + "1" + closer * depth, 1)
    if draw(st.integers(0, 9)) == 0:  # sometimes cut or spoil it
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.text(max_size=3))
    return text.encode("utf-8", "surrogatepass")


# --- HTTP ---

header_line = st.sampled_from([
    b"Content-Type: application/json", b"Expect: 100-continue", b"Connection: keep-alive", b"Connection: close",
    b"Transfer-Encoding: gzip", b"Transfer-Encoding: chunked, gzip", b"Transfer-Encoding: identity",
    b"Transfer-Encoding: chunked", b"Content-Length: 5", b"Content-Length: -1", b"Content-Length: 99999999999999999999",
    b"Content-Length: abc", b"Authorization: bearer " + KEY.encode(), b"Authorization: Basic eDp5",
    b"Authorization: Bearer", b"X-Tern-Room: zz", b"X-Forwarded-For: 10.0.0.1", b"Host: x", b"X: \x01\x7f",
    b"NoColon", b" leading-space: 1", b"X-Big: " + b"a" * 20000]) | st.binary(max_size=40)


@st.composite
def http_request(draw):
    path = draw(st.sampled_from(PATHS))
    target = draw(st.sampled_from([path, "http://127.0.0.1" + path, "HTTPS://h:1" + path + "?q=1", path + "?" + "x" * 100,
                                   "//" + path, "", "/%00" + path]))
    method = draw(st.sampled_from(["POST", "POST", "GET", "PUT", "HEAD", "OPTIONS", "DELETE", "PRI", "post", "G\x00T"]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/0.9", "HTTP/2.0", "", "HTTP/1.1x"]))
    body = draw(json_body(path) | st.binary(max_size=64))
    framing = draw(st.sampled_from(["length", "length", "chunked", "chunked-bad", "none", "length-wrong"]))
    headers = [b"Host: x", b"Authorization: Bearer " + KEY.encode()] if draw(st.booleans()) else []
    headers += draw(st.lists(header_line, max_size=3))
    if framing == "length":
        headers.append(b"Content-Length: %d" % len(body))
    elif framing == "length-wrong":
        headers.append(b"Content-Length: %d" % max(0, len(body) + draw(st.integers(-5, 5))))
    elif framing.startswith("chunked"):
        headers.append(b"Transfer-Encoding: chunked")
        size = b"%x" % len(body) if framing == "chunked" else draw(st.sampled_from([b"-1", b"zz", b"ffffffffffffffffff", b"1;ext"]))
        body = size + b"\r\n" + body + b"\r\n0\r\n\r\n"
    head = f"{method} {target} {version}".encode("utf-8", "surrogatepass")
    return head + b"\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body


# --- the run ---

def exchange(port, data, deadline=1.0):
    """Sends `data` and reads until the server closes, one response is complete or `deadline` passes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=deadline)
    out = b""
    end = time.time() + deadline
    try:
        s.sendall(data)
        while time.time() < end:
            s.settimeout(max(0.01, end - time.time()))
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
            if complete(out):
                break
    except (socket.timeout, ConnectionError, OSError):
        pass
    finally:
        s.close()
    return out


def complete(response):
    head, sep, body = response.partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
    if m:
        return len(body) >= int(m.group(1))
    return body.endswith(b"0\r\n\r\n")


class Target:
    def __init__(self, name, proc):
        self.name, self.proc, self.inputs = name, proc, 0

    def check(self, data):
        self.inputs += 1
        reply = exchange(self.proc.port, data)
        statuses = [int(c) for c in re.findall(rb"HTTP/1\.[01] (\d{3}) ", reply)]
        if self.proc.proc.poll() is not None:
            pytest.fail(f"{self.name} died (exit {self.proc.proc.returncode}) on input {data[:2000]!r}\n"
                        f"{self.proc.log()[-3000:]}")
        assert 500 not in statuses, f"{self.name} answered 500 to {data[:2000]!r}: {reply[:500]!r}"


def fuzz(target, seconds):
    deadline = time.time() + seconds

    @settings(max_examples=BATCH, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(http_request())
    def one(data):
        if time.time() < deadline:
            target.check(data)

    start = time.time()
    while time.time() < deadline:
        one()
    return time.time() - start


@pytest.fixture(scope="module")
def targets():
    s = serve("both", "--api-key", KEY, "--max-model-len", "128", "--state-memory", "64M")
    r = route("--server", s.url, "--api-key", KEY, "--upstream-api-key", KEY, "--header-timeout", "2")
    yield [Target("tern serve", s), Target("tern route", r)]
    r.stop()
    s.stop()


def test_regressions_then_a_bounded_fuzz_run(targets):
    for t in targets:
        for name, data in CASES:
            t.check(data)
        print(f"[fuzz] {t.name}: {len(CASES)} regression cases pass")
    lines = []
    for t in targets:
        before = t.inputs
        took = fuzz(t, BUDGET / len(targets))
        lines.append(f"[fuzz] {t.name}: {t.inputs - before} inputs in {took:.1f} s, no crash, no 500")
        print(lines[-1])
    if os.environ.get("TERN_FUZZ_SUMMARY"):  # scripts/test prints it after the tests (ctest hides passing output)
        with open(os.environ["TERN_FUZZ_SUMMARY"], "w") as f:
            f.write("\n".join(lines) + "\n")
