"""The per-request admission check of a decode: chunked transfer cannot feed a stateful DCP decode.

Chunked transfer (the prefill streams a request's cache in chunks as it computes it) sends no
per-request KDA state to a DCP decode. Neither side can refuse it at startup: chunking is the
producer's setting, and the producer learns the decode's DCP only from the request. So the
decode checks each request before enqueueing it (ATOM answers HTTP 400), as it does the other
chunked topologies it cannot serve.
"""

from __future__ import annotations

from .._args import expect_args
from ..deployment import Deployment
from ..errors import Refusal
from ..model import HybridModel


def admission_refusal(
    model: HybridModel, decode: Deployment, *, chunked_transfer: bool
) -> Refusal | None:
    """Why the decode must reject a request, or ``None`` to admit it.

    Refuses (``chunked_dcp_stateful``) a chunked transfer to a decode with ``dcp > 1`` of a
    model with KDA layers. A stateless (pure MLA) model, a DCP-free decode or a whole
    (unchunked) transfer is admitted.
    """
    expect_args(
        ("model", model, HybridModel),
        ("decode", decode, Deployment),
        ("chunked_transfer", chunked_transfer, bool),
    )
    num_kda_layers = len(model.kda_layer_ids)
    if not (chunked_transfer and decode.dcp > 1 and num_kda_layers):
        return None
    return Refusal(
        "chunked_dcp_stateful",
        f"request refused: chunked transfer to a decode with dcp={decode.dcp} carries no KDA "
        f"state, and model {model.name} has {num_kda_layers} KDA layers",
        facts={
            "chunked_transfer": True,
            "dcp": decode.dcp,
            "model": model.name,
            "num_kda_layers": num_kda_layers,
        },
        hint="send the request unchunked, or route it to a decode with dcp=1",
    )


def check_admission(model: HybridModel, decode: Deployment, *, chunked_transfer: bool) -> None:
    """Raise :func:`admission_refusal`'s refusal, if any (call once per request)."""
    refusal = admission_refusal(model, decode, chunked_transfer=chunked_transfer)
    if refusal is not None:
        raise refusal
