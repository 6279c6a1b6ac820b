#!/usr/bin/env python3
"""Writes worked examples of DeepSeek-V4 prompt encoding: each case's messages and options with the
prompt DeepSeek's encoding_dsv4.py produces (tests/tokenizer/data/chat_examples.json).

The reference is passed as a path, e.g. the copy vLLM ships in its wheel
(vllm/tokenizers/deepseek_v4_encoding.py, the 0731 revision of reasoning effort; it names the
assistant field `reasoning`, so `reasoning_content` is renamed on the way in):
  pip download --no-deps vllm==0.33.0 && unzip -j vllm-*.whl vllm/tokenizers/deepseek_v4_encoding.py
  python3 chat_examples.py deepseek_v4_encoding.py > ../data/chat_examples.json
"""
import copy
import importlib.util
import json
import sys

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Web search, 返回结果",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "opts": {"type": "object"}}}}}


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


TOOL_TURNS = [
    {"role": "system", "content": "You are a helpful assistant.", "tools": [WEATHER, SEARCH]},
    {"role": "user", "content": "Weather in Paris and Tokyo for 3 days?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two cities: call the tool twice.",
     "tool_calls": [call("c1", "get_weather", {"city": "Paris", "days": 3}),
                    call("c2", "get_weather", {"city": "東京", "days": 3})]},
    {"role": "tool", "tool_call_id": "c2", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 17}"},
    {"role": "assistant", "content": "Paris 17°C, Tokyo 21°C.", "reasoning_content": "Both results are in."},
    {"role": "user", "content": "And search the news?"},
]

CASES = [
    ("user_thinking", [{"role": "user", "content": "Hello"}], {"thinking_mode": "thinking"}),
    ("user_chat", [{"role": "user", "content": "Hello"}], {"thinking_mode": "chat"}),
    ("system_user_thinking", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
     {"thinking_mode": "thinking"}),
    ("effort_high", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Prove it."}],
     {"thinking_mode": "thinking", "reasoning_effort": "high"}),
    ("effort_max", [{"role": "user", "content": "Prove it."}], {"thinking_mode": "thinking", "reasoning_effort": "max"}),
    ("effort_low", [{"role": "user", "content": "Prove it."}], {"thinking_mode": "thinking", "reasoning_effort": "low"}),
    ("effort_ignored_in_chat", [{"role": "user", "content": "Prove it."}], {"thinking_mode": "chat", "reasoning_effort": "max"}),
    ("multi_turn_drop_thinking", [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "think 1"},
        {"role": "user", "content": "Q2"}], {"thinking_mode": "thinking"}),
    ("multi_turn_keep_thinking", [
        {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "think 1"},
        {"role": "user", "content": "Q2"}], {"thinking_mode": "thinking", "drop_thinking": False}),
    ("multi_turn_chat", [
        {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "ignored"},
        {"role": "user", "content": "Q2"}], {"thinking_mode": "chat"}),
    ("last_assistant_thinking", [
        {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "r1"}],
     {"thinking_mode": "thinking"}),
    ("prefill_wo_eos", [
        {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "Partial", "reasoning_content": "r", "wo_eos": True}],
     {"thinking_mode": "thinking"}),
    ("tools_thinking", TOOL_TURNS, {"thinking_mode": "thinking"}),
    ("tools_chat", TOOL_TURNS, {"thinking_mode": "chat"}),
    ("tool_call_last", TOOL_TURNS[:3], {"thinking_mode": "thinking"}),
    ("tool_result_last", TOOL_TURNS[:5], {"thinking_mode": "thinking"}),
    ("tool_args_types", [
        {"role": "system", "content": "", "tools": [SEARCH]}, {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Searching.", "tool_calls": [call("x", "search", {
            "q": "naïve \"quotes\"\n\tand 中文", "opts": {"n": 5, "safe": True, "langs": ["en", "fr"], "ratio": 0.5, "none": None}})]},
        {"role": "tool", "tool_call_id": "x", "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
        {"role": "user", "content": "thanks"}], {"thinking_mode": "thinking"}),
    ("developer", [{"role": "developer", "content": "Dev rules.", "tools": [WEATHER]}, {"role": "user", "content": "hi"}],
     {"thinking_mode": "thinking"}),
    ("latest_reminder", [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                         {"role": "latest_reminder", "content": "Today is Monday."}], {"thinking_mode": "thinking"}),
    ("consecutive_users", [{"role": "user", "content": "part one"}, {"role": "user", "content": "part two"}],
     {"thinking_mode": "chat"}),
    ("response_format", [{"role": "system", "content": "JSON only.", "response_format": {"type": "json_object"}},
                         {"role": "user", "content": "list"}], {"thinking_mode": "chat"}),
    ("user_content_parts", [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
     {"thinking_mode": "thinking"}),
    ("task_title", [{"role": "user", "content": "Summarize this chat", "task": "title"}], {"thinking_mode": "thinking"}),
    ("task_action", [{"role": "user", "content": "Do it", "task": "action"}], {"thinking_mode": "chat"}),
    ("no_bos", [{"role": "user", "content": "x"}], {"thinking_mode": "chat", "add_default_bos_token": False}),
    ("special_text_in_content", [{"role": "user", "content": "what is <think> and <｜User｜>?"}], {"thinking_mode": "chat"}),
]


def main():
    spec = importlib.util.spec_from_file_location("encoding_dsv4", sys.argv[1])
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    field = "reasoning" if "msg.get(\"reasoning\")" in open(sys.argv[1]).read() else "reasoning_content"
    out = []
    for name, messages, options in CASES:
        fed = copy.deepcopy(messages)
        for m in fed:
            if "reasoning_content" in m and field != "reasoning_content":
                m[field] = m.pop("reasoning_content")
        prompt = ref.encode_messages(fed, **options)
        out.append({"name": name, "messages": messages, "options": options, "prompt": prompt})
    json.dump({"source": "encoding_dsv4.py (DeepSeek-V4), 0731 reasoning-effort revision, via vLLM 0.33.0's copy",
               "cases": out}, sys.stdout, ensure_ascii=False, indent=1)
    print()


if __name__ == "__main__":
    main()
