"""A fleet process's NATS session, run again after each link error: the one run loop the
worker, the edge owner and the solver share (`controller.fleet.workerloop`,
`controller.fleet.ownerloop`, `controller.fleet.solverloop`), on the one reconnect helper
(`mqttlink.reconnect.reconnect_loop`) with the settings' backoff."""

from __future__ import annotations

from collections.abc import Callable

from mqttlink.reconnect import Backoff, Session, reconnect_loop
from natslink.errors import LINK_ERRORS
from natslink.settings import NatsSettings

Log = Callable[..., None]


async def run_sessions(
    settings: NatsSettings, session: Session, log: Log, clock_ns: Callable[[], int],
    *, max_attempts: int | None = None,
) -> None:  # fmt: skip
    """Run ``session(connected)`` until it returns or is cancelled, again after each link
    error (`natslink.errors.LINK_ERRORS`, logged as ``nats error`` with the delay) with the
    backoff of ``settings`` (jittered); returns after ``max_attempts`` attempts at most (None:
    no bound). Other exceptions propagate."""

    def on_error(exc: BaseException, delay_s: float) -> None:
        log(clock_ns(), "nats error", error=str(exc), retry_in_s=round(delay_s, 3))

    backoff = Backoff(settings.backoff_min_s, settings.backoff_max_s, jitter=0.2)
    await reconnect_loop(session, backoff, on_error=on_error, max_attempts=max_attempts,
                         errors=LINK_ERRORS)  # fmt: skip
