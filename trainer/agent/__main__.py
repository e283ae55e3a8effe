"""`python -m trainer.agent [--node NAME] -- COMMAND...` (also the `ftplane-agent` console script).

The command is what the agent starts and supervises: the job's ft_launcher command line. The rest
comes from the environment the backend sets: FTPLANE_URL, FTPLANE_JOB_ID, FTPLANE_ATTEMPT,
FTPLANE_TOKEN, FTPLANE_NODE_NAME, FTPLANE_REPORT_INTERVAL_S, FTPLANE_LOG_PATTERN, FTPLANE_AGENT_DIR.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from trainer.agent.config import AgentConfig
from trainer.agent.node import NodeAgent


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print("usage: python -m trainer.agent [--node NAME] -- COMMAND...", file=sys.stderr)
        return 2
    split = args.index("--")
    parser = argparse.ArgumentParser(prog="ftplane-agent")
    parser.add_argument("--node", help="this node's name (default: FTPLANE_NODE_NAME, else the host name)")
    options = parser.parse_args(args[:split])
    command = args[split + 1 :]
    if not command:
        print("ftplane-agent: no command to run after --", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=os.environ.get("FTPLANE_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s [agent] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    environ = dict(os.environ)
    if options.node:
        environ["FTPLANE_NODE_NAME"] = options.node
    try:
        config = AgentConfig.from_environment(command, environ)
    except ValueError as exc:
        print(f"ftplane-agent: {exc}", file=sys.stderr)
        return 2
    return NodeAgent(config).run()


if __name__ == "__main__":
    sys.exit(main())
