"""Every input that ever crashed `tern serve` or `tern route` (or made one answer 500), replayed before each
fuzz run. Issue #16's probe found the first ones; the fuzz run (test_fuzz.py) prints any new one as a
Python bytes literal to add here. Large nested inputs are built, not stored."""
import json

KEY = "fuzz-key"


def request(path, body, method="POST", extra=b""):
    body = body if isinstance(body, bytes) else body.encode()
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode() + extra + b"\r\n" + body


def nested(depth):
    return "[" * depth + "]" * depth


def nested_objects(depth):
    return '{"a":' * depth + "1" + "}" * depth


CHAT = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1'
CALL = ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": '
        '[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": %s}}]}], "max_tokens": 1}')

CASES = [
    # issue #16: SIGSEGV while re-serialising deep JSON (dump()) after parsing
    ("tools parameters, 50 000 levels", request("/v1/chat/completions", CHAT + ', "tools": [{"type": "function", '
                                                 '"function": {"name": "f", "parameters": ' + nested(50000) + "}}]}")),
    ("tool call arguments as text, 200 000 levels", request("/v1/chat/completions", CALL % json.dumps(nested_objects(200000)))),
    ("tool call arguments as JSON, 200 000 levels", request("/v1/chat/completions", CALL % nested_objects(200000))),
    ("tool call arguments as a list, 200 000 levels", request("/v1/chat/completions", CALL % nested(200000))),
    ("messages, 100 000 levels (crashed the router)", request("/v1/chat/completions", '{"messages": ' + nested(100000) + "}")),
    ("tokenize with deep tools", request("/tokenize", '{"messages": [{"role": "user", "content": "hi"}], "tools": '
                                         '[{"type": "function", "function": {"name": "f", "parameters": ' +
                                         nested(50000) + "}}]}")),
    # issue #16: smuggling behind a proxy (the bytes after the head were read as a second request)
    ("transfer coding gzip", b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nAuthorization: Bearer " +
     KEY.encode() + b"\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"),
    # found while the limits were written (reading the request parser), answered 500 on main:
    # json::value() on a field of the wrong type threw a type_error
    ("response_format type not a string", request("/v1/chat/completions", CHAT + ', "response_format": {"type": 5}}')),
    ("content part type not a string", request("/v1/chat/completions",
                                               '{"messages": [{"role": "user", "content": [{"type": 1, "text": "x"}]}]}')),
    ("tool call id not a string", request("/v1/chat/completions", CALL.replace('"id": "c1"', '"id": 7') % '"{}"')),
    ("tool type not a string", request("/v1/chat/completions", CHAT + ', "tools": [{"type": [], "function": {"name": "f"}}]}')),
    ("tool description not a string", request("/v1/chat/completions", CHAT + ', "tools": [{"type": "function", '
                                              '"function": {"name": "f", "description": {}}}]}')),
]
