"""One server-set member: Twitter's ``ServiceInstance`` as JSON (sans-IO).

Finagle, twitter-commons' ``ServerSetImpl`` and Kestrel 2.4 store each
member of a server set as an ephemeral sequential node ``member_NNNNNNNNNN``
whose data is::

    {"serviceEndpoint": {"host": "10.0.0.1", "port": 22133},
     "additionalEndpoints": {"memcache": {"host": "10.0.0.1", "port": 22133}},
     "status": "ALIVE"}

A member is present only while its server is in the set (leaving deletes
the node), so every member a reader finds is ALIVE.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

#: Node names of members (``member_0000000007``), as twitter-commons names them.
MEMBER_PREFIX = "member_"
#: The order in which a server's endpoints become its main endpoint (as Kestrel).
ENDPOINT_ORDER = ("memcache", "thrift", "text")


@dataclass(slots=True, frozen=True)
class Endpoint:
    host: str
    port: int

    def as_json(self) -> dict[str, object]:
        return {"host": self.host, "port": self.port}


@dataclass(slots=True, frozen=True)
class Member:
    """A server as its server sets show it."""

    service_endpoint: Endpoint
    additional_endpoints: dict[str, Endpoint] = field(default_factory=dict)
    status: str = "ALIVE"

    @classmethod
    def of_server(cls, endpoints: dict[str, Endpoint]) -> Member:
        """The member of a server listening on ``endpoints`` (name -> endpoint).

        The main endpoint is memcache, else thrift, else text, as in Kestrel.
        """
        for name in ENDPOINT_ORDER:
            if name in endpoints:
                return cls(endpoints[name], dict(endpoints))
        raise ValueError(f"no memcache, thrift or text endpoint in {sorted(endpoints)}")

    def encode(self) -> bytes:
        doc = {
            "serviceEndpoint": self.service_endpoint.as_json(),
            "additionalEndpoints": {
                name: ep.as_json() for name, ep in self.additional_endpoints.items()
            },
            "status": self.status,
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    def endpoint(self, name: str) -> Endpoint | None:
        """The endpoint of protocol ``name``; the main endpoint for memcache when not listed
        (a server set written by a tool that gives only ``serviceEndpoint``)."""
        found = self.additional_endpoints.get(name)
        if found is None and name == "memcache" and not self.additional_endpoints:
            return self.service_endpoint
        return found


def _endpoint(doc: object, where: str) -> Endpoint:
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: expected an object")
    host, port = doc.get("host"), doc.get("port")
    if not isinstance(host, str) or not host:
        raise ValueError(f"{where}.host: expected a host name")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"{where}.port: expected a TCP port")
    return Endpoint(host, port)


def parse_member(data: bytes) -> Member:
    """A member node's data; ValueError (saying what is wrong) for anything else."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    main = _endpoint(doc.get("serviceEndpoint"), "serviceEndpoint")
    extra = doc.get("additionalEndpoints") or {}
    if not isinstance(extra, dict):
        raise ValueError("additionalEndpoints: expected an object")
    endpoints = {
        str(name): _endpoint(ep, f"additionalEndpoints.{name}") for name, ep in extra.items()
    }
    status = doc.get("status", "ALIVE")
    if not isinstance(status, str):
        raise ValueError("status: expected a string")
    return Member(main, endpoints, status)
