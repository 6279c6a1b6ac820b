#!/usr/bin/env python3
"""Runs sglang's bench_serving (sglang.benchmark.serving) unchanged, on a machine without a GPU.

`import sglang.benchmark.serving` pulls in sglang.srt.disaggregation.utils for one constant
(FAKE_BOOTSTRAP_HOST), and that module imports sglang's model configs, which need torchvision.
This wrapper provides that one constant instead; the benchmark code itself runs as shipped.
Arguments are bench_serving's own.
"""
import runpy
import sys
import types

stub = types.ModuleType("sglang.srt.disaggregation.utils")
stub.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # the value sglang defines
sys.modules["sglang.srt.disaggregation.utils"] = stub
sys.argv = ["sglang.benchmark.serving"] + sys.argv[1:]
runpy.run_module("sglang.benchmark.serving", run_name="__main__")
