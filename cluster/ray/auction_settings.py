"""The auction actor's config shapes (the edge of ``auction.admission.AuctionSettings``) and the
accounts it opens from the users file."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import ConfigDict, Field

from auction.admission import SETTING_BOUNDS, AuctionSettings
from auction.schedulers import SCHEDULERS
from cluster.events import MAX_ID_CHARS
from cluster.ledger.sqlite import MAX_AMOUNT
from cluster.models import StrictModel

__all__ = ["AuctionSettingsModel", "UserAccount"]

_B = SETTING_BOUNDS  # one table of bounds for the dataclass and this edge model
_D = AuctionSettings()  # and one set of defaults: the dataclass's


class AuctionSettingsModel(StrictModel):
    """The ``auction:`` section of the service's config (the YAML edge of ``AuctionSettings``)."""

    batch_size: int = Field(_D.batch_size, ge=_B["batch_size"][0], le=_B["batch_size"][1])
    batch_window_ms: float = Field(
        _D.batch_window_ms, ge=_B["batch_window_ms"][0], le=_B["batch_window_ms"][1]
    )
    queue_threshold: int = Field(
        _D.queue_threshold, ge=_B["queue_threshold"][0], le=_B["queue_threshold"][1]
    )
    # None (the default): derived from the engines' batch capacity by the composition root
    # (``ServeConfig.prefill_slots_per_worker`` per prefill worker, following re-splits);
    # a number fixes it.
    max_in_prefill: int | None = Field(None, ge=_B["max_in_prefill"][0], le=_B["max_in_prefill"][1])
    scheduler: Literal["dfs-bid", "dfs-uniform", "dfs-weight", "bid-sort", "no-sort"] = _D.scheduler  # type: ignore[assignment]  # the dataclass's str; the Literal checks it
    max_queue: int = Field(_D.max_queue, ge=_B["max_queue"][0], le=_B["max_queue"][1])

    def to_settings(self, derived_max_in_prefill: int = _D.max_in_prefill) -> AuctionSettings:
        """The dataclass, ``max_in_prefill`` given or else ``derived_max_in_prefill``."""
        values = self.model_dump()
        if values["max_in_prefill"] is None:
            values["max_in_prefill"] = derived_max_in_prefill
        return AuctionSettings(**values)


# The Literal above names every scheduler the auction knows, and nothing else.
assert set(get_args(AuctionSettingsModel.model_fields["scheduler"].annotation)) == set(SCHEDULERS)


class UserAccount(StrictModel):
    # Extra keys (a users file's key_sha256) are ignored: only the name and budget matter here.
    model_config = ConfigDict(**{**StrictModel.model_config, "extra": "ignore"})
    name: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    budget: float = Field(ge=0.0, le=MAX_AMOUNT)
