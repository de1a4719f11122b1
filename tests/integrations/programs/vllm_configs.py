"""The vLLM configuration each entry point builds from a command line, on the CPU, with the device
vLLM's defaults depend on faked: an 80 GiB H100 (vllm.engine.arg_utils.current_platform answers
for it). Prints one JSON object: the config fingerprints of

- old_record / old_restore: materialize's old path (vllm.LLM with the user's arguments) and the
  restore (`vllm serve` with them);
- record / restore: the new path (vllm.LLM with `vllm serve`'s defaults pinned and the KV size
  set, as materialize records) and the restore `medusa run --engine vllm` starts from the
  artifact (the real `vllm serve` command line it builds);

and how vLLM's parsers read the KV-size flag materialize writes.

    python vllm_configs.py WORKDIR MODEL [vLLM args]
"""

import json
import sys
from pathlib import Path

import vllm.engine.arg_utils as arg_utils
from vllm.engine.arg_utils import EngineArgs

from medusa.integrations.vllm.materialize import KV_FLAG, with_kv_size
from medusa.integrations.vllm.schema import config_fingerprint
from medusa.integrations.vllm.serve import serve_command
from medusa.integrations.vllm.startup import engine_kwargs, serve_defaults

GiB = 1 << 30


class H100:
    """The platform as vLLM's batch defaults see it on an 80 GiB H100; the rest is the CPU's."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def get_device_total_memory(self, device_id=0):
        return 80 * GiB

    def get_device_name(self, device_id=0):
        return "NVIDIA H100 80GB HBM3"

    def is_device_capability(self, *args, **kwargs):
        return False

    def is_cpu(self):
        return False


class Built(Exception):
    """Stops an entry point once vLLM has built its configuration."""


_build = EngineArgs.create_engine_config
stopping = False


def create_engine_config(self, *args, **kwargs):
    config = _build(self, *args, **kwargs)
    if stopping:
        raise Built(config)
    return config


def built_by(start):
    global stopping
    stopping = True
    try:
        start()
    except Built as b:
        return config_fingerprint(b.args[0])
    finally:
        stopping = False
    raise AssertionError("the entry point never built a vLLM configuration")


def llm(argv):
    from vllm import LLM

    return built_by(lambda: LLM(**engine_kwargs(argv)))


def serve(cmd):
    from vllm.entrypoints.cli.main import main

    def start():
        sys.argv = ["vllm", *cmd[cmd.index("serve") :]]
        main()

    return built_by(start)


def restore_command(work, recorded):
    from medusa.artifact import save_artifact
    from medusa.integrations.vllm.schema import vllm_section

    manifest = {  # a sealed artifact with what `medusa run --engine vllm` reads (no plan)
        "kind": "vllm",
        "model": {"identity": "vllm:0", "name": "tiny-llama"},
        "engine": {"name": "vllm", "argv": recorded},
        "device": {},
        "graphs": {"count": 0, "keys": [], "nodes": 0, "templates": 0},
        "relocations": {},
        "kernels": {"count": 0, "exported": 0, "hidden": 0, "images_saved": 0},
        "vllm": vllm_section(
            version="0.32.0",
            kv_cache_memory_bytes=3 * GiB,
            cudagraph_mode="FULL_AND_PIECEWISE",
            graphs=[],
            compile_cache=None,
        ),
    }
    art = save_artifact(work / "artifact", manifest, {"graphs": []}, {})
    cmd, _ = serve_command(str(art), None, [], "127.0.0.1", 0, require=False)
    return cmd


def kv_flag(recorded):
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = vars(parser.parse_args(["--model", *recorded[:1], *recorded[1:]]))
    return {
        "parsed": parsed["kv_cache_memory_bytes"],
        "defined": KV_FLAG in parser._option_string_actions,
        "dest": parser._option_string_actions[KV_FLAG].dest,
    }


def main():
    work, argv = Path(sys.argv[1]), sys.argv[2:]
    arg_utils.current_platform = H100(arg_utils.current_platform)
    EngineArgs.create_engine_config = create_engine_config
    recorded = with_kv_size(serve_defaults(argv), 3 * GiB)
    out = {
        "old_record": llm(argv),
        "old_restore": serve(restore_command(work / "old", with_kv_size(argv, 3 * GiB))),
        "recorded_argv": recorded,
        "record": llm(recorded),
        "restore": serve(restore_command(work / "new", recorded)),
        "kv_flag": kv_flag(recorded),
    }
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
