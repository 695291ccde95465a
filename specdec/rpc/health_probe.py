"""`python -m specdec.rpc.health_probe HOST:PORT --config FILE`: exit 0 when the server reports SERVING.

Kubernetes' own gRPC probe speaks plaintext only, so it cannot reach a server that requires TLS; the
pods of a secured deployment probe with this instead, presenting the config's credentials (the
`security` section) exactly as the other servers do.
"""
from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.rpc.security import open_channel
from specdec.serving_config import load_stack_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec.rpc.health_probe")
    parser.add_argument("address", help="HOST:PORT of a specdec server")
    parser.add_argument("--config", required=True, help="the deployment file whose security section to present")
    parser.add_argument("--timeout-s", type=float, default=4.0)
    args = parser.parse_args(argv)
    security = load_stack_config(args.config).security
    with open_channel(args.address, security) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=args.timeout_s)
        except grpc.RpcError as exc:
            print(f"health_probe: {args.address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    if not serving:
        print(f"health_probe: {args.address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}",
              file=sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
