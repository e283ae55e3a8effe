"""`python -m ftplane.trainer.agent [--node NAME] -- COMMAND...` (also the `ftplane-agent` console script).

The command is what the agent starts and supervises: the job's ft_launcher command line. The rest
comes from the environment the backend sets: FTPLANE_URL, FTPLANE_JOB_ID, FTPLANE_ATTEMPT,
FTPLANE_TOKEN, FTPLANE_NODE_NAME, FTPLANE_REPORT_INTERVAL_S, FTPLANE_LOG_PATTERN, FTPLANE_PROGRESS_PRESET,
FTPLANE_AGENT_DIR; and FTPLANE_RANK_ENV, the spec's `env` as JSON, which the agent gives the ranks only.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ftplane.contract import Env
from ftplane.trainer.agent.config import AgentConfig
from ftplane.trainer.agent.node import NodeAgent
from ftplane.trainer.agent.redaction import RedactingFilter, Redactor


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print("usage: python -m ftplane.trainer.agent [--node NAME] -- COMMAND...", file=sys.stderr)
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
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter(Redactor.from_environment(os.environ)))
    environ = dict(os.environ)
    if options.node:
        environ[Env.NODE_NAME] = options.node
    try:
        config = AgentConfig.from_environment(command, environ)
    except ValueError as exc:
        print(f"ftplane-agent: {exc}", file=sys.stderr)
        return 2
    return NodeAgent(config).run()


if __name__ == "__main__":
    sys.exit(main())
