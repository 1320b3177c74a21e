"""Which ZooKeeper client a coordinator runs on: the asyncio connection (the default) or kazoo.

``?client=kazoo|asyncio`` in the ``zk://`` URL chooses; without it, the
environment variable ``PAIMON_GROUP_ZK_CLIENT`` does (so a whole deployment,
or a test or benchmark run, can be switched at once); else the asyncio
connection, chosen on the figures of docs/zookeeper.md. Both offer
the coordinator the same calls (kazoo's names); only starting and stopping
differ, and they are here and in :meth:`ZkCore._stop_client`.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from typing import Any

from coordinators.errors import ConfigError
from coordinators.zookeeper.aio import AioZkClient
from coordinators.zookeeper.core import start_client
from coordinators.zookeeper.heartbeat import Heartbeat
from coordinators.zookeeper.url import CLIENTS, ZkTarget
from coordinators.zookeeper.wire import tls_context

ENVIRONMENT = "PAIMON_GROUP_ZK_CLIENT"


def chosen_client(target: ZkTarget) -> str:
    """``kazoo`` or ``asyncio``: the URL's choice, else the environment's, else asyncio."""
    if target.client is not None:
        return target.client
    chosen = os.environ.get(ENVIRONMENT, "").strip() or "asyncio"
    if chosen not in CLIENTS:
        raise ConfigError(f"{ENVIRONMENT}={chosen!r}: choose kazoo or asyncio")
    return chosen


class ClientChoice(Heartbeat):
    """Making and starting the chosen client."""

    @property
    def client_kind(self) -> str:
        """The client this coordinator connects with, ``kazoo`` or ``asyncio``
        (:func:`chosen_client`); shown to the backend's tests."""
        return chosen_client(self._target)

    def _make_aio_client(self) -> AioZkClient:
        options, credentials = self._options, self._credentials
        tls = None
        if options.tls:
            tls = functools.partial(tls_context, options.tls_ca, options.tls_cert, options.tls_key)
        client = AioZkClient(
            list(self._target.hosts),
            timeout_s=self._requested_timeout_s,
            auth_data=credentials.auth_data if credentials else None,
            sasl_options=dict(credentials.sasl_options)
            if credentials and credentials.sasl_options
            else None,
            tls=tls,
            max_delay_s=max(0.2, min(2.0, self._requested_timeout_s / 4)),
        )
        client.add_listener(functools.partial(self._on_kazoo_state, client))
        return client

    async def _start_chosen(
        self, client: Any, limit: float, give_up: Callable[[], bool]
    ) -> bool:
        """Start ``client`` and wait for its first session: True if connected in time
        (kazoo stops waiting early when ``give_up()``)."""
        if isinstance(client, AioZkClient):
            connected = await client.start(limit)
            self._handshake_error = client.handshake_error
            self._negotiated_timeout_s = client.negotiated_timeout_s
            return connected
        loop = asyncio.get_running_loop()
        return bool(
            await loop.run_in_executor(
                None, start_client, client, limit, self._handshake_done, give_up
            )
        )
