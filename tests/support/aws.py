"""The moto server the AWS tests talk to over real HTTP, and fresh resources on it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def moto_endpoint() -> Iterator[str]:
    """A local moto server on a free port, stopped when the generator closes."""
    import moto.server as moto_server

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def fresh_resources(endpoint: str, monkeypatch: Any) -> dict[str, Any]:
    """Fake credentials, and a new bucket and table (same name) on the moto server."""
    import boto3

    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    name = f"audit-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket=name)
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint)
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "run_id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "run_id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return {"url": endpoint, "name": name, "s3": s3, "dynamodb": dynamodb}
