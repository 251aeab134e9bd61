"""What differs between the tokenspeed revisions k3layout follows, as one record per revision.

Every rule the revisions share lives in :mod:`.recipe` (groups, planes, padding, addresses),
:mod:`.capacity`, :mod:`.rules`, :mod:`.budget` and :mod:`.launch`; what one revision does
otherwise is a field here, chosen by ``Deployment.engine_version`` (:func:`revision_of`). Each
field was read off the revision's own recipe by running it on CPU and recording its answers
(``tests/fixtures/tokenspeed-1152/`` and ``tests/fixtures/tokenspeed-main/``, whose
``DIFFERENCES.md`` says where in tokenspeed each difference lives). The next revision is one
more record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from ..._args import expect_args
from ...deployment import Deployment

REPOSITORY: Final = "lightseekorg/tokenspeed"


@dataclass(frozen=True)
class TokenspeedRevision:
    """The rules of one tokenspeed revision that the others do not share.

    - ``name``: its ``Deployment.engine_version``;
    - ``commit``, ``ref``: the commit whose K3 recipe is followed, and the ref it was fetched as;
    - ``title``: how plans, reports and refusals name it;
    - ``fixed_mla_packing``: the MLA pages per parent plane the recipe pins (``main``: 12,
      ``_KIMI_K3_MLA_PACKING``), or ``None`` where the recipe grows them until one plane
      holds a whole KDA state, ``ceil(S / page)`` (#1152). Either way the state groups take
      ``max(1, p_m x page // S)``;
    - ``replay_verify_vendors``: the GPU vendors where tokenspeed-kernel registers the KDA
      replay-commit kernels (``kda_replay_commit`` and the no-store ``kda_fused_paged_verify``,
      ``kda_dispatch.py``), so that a speculative launch reserves the replay-commit verify
      workspace (tokenspeed #1156: one conv checkpoint row per live request and compact replay
      rows) instead of dense KDA state rows; empty where the revision has no replay commit;
    - ``replay_verify_dtypes``: the model activation dtypes those kernels take.
    """

    name: str
    commit: str
    ref: str
    title: str
    fixed_mla_packing: int | None
    replay_verify_vendors: tuple[str, ...] = ()
    replay_verify_dtypes: tuple[str, ...] = ()

    @property
    def packing_formula(self) -> str:
        """The packing rule in words."""
        if self.fixed_mla_packing is None:
            return "p_m = max(1, ceil(S / page)), p_l = max(1, p_m * page // S)"
        fixed = self.fixed_mla_packing
        return f"p_m = {fixed} (fixed), p_l = max(1, {fixed} * page // S)"

    def packing(self, mla_page_bytes: int, state_bytes: int) -> tuple[int, int]:
        """``(p_m, p_l)`` for one MLA page of ``mla_page_bytes`` and one KDA layer's state of
        ``state_bytes`` (the conv and recurrent payloads of the first state group's layer on
        plane ``slot.0``), as the revision's ``KimiK3Recipe.packing`` gives them."""
        fixed = self.fixed_mla_packing
        mla_pages = max(1, -(-state_bytes // mla_page_bytes)) if fixed is None else fixed
        return mla_pages, max(1, mla_pages * mla_page_bytes // state_bytes)

    def replays_verify(self, vendor: str, activation_dtype: str) -> bool:
        """Whether a speculative launch on a ``vendor`` GPU with ``activation_dtype``
        activations reserves the replay-commit verify workspace (``KimiK3Recipe.replay_kda``:
        tokenspeed-kernel's ``kda_replay_commit_supported``)."""
        return vendor in self.replay_verify_vendors and activation_dtype in (
            self.replay_verify_dtypes
        )


PR1152: Final = TokenspeedRevision(
    name="pr1152",
    commit="a6ee91b3e612d111b0ad6361607f221419d139f7",
    ref="refs/pull/1152/head",
    title="tokenspeed #1152 head a6ee91b3",
    fixed_mla_packing=None,
)
"""PR #1152's head ("derive the Kimi-K3 MLA packing from the KDA state size")."""

MAIN: Final = TokenspeedRevision(
    name="main",
    commit="f4d8ec6e039c028c7ee71317ccfb84e56ae2b45c",
    ref="refs/heads/main",
    title="tokenspeed main f4d8ec6e",
    fixed_mla_packing=12,
    replay_verify_vendors=("nvidia",),
    replay_verify_dtypes=("bfloat16", "float16"),
)
"""tokenspeed's ``main`` at ``f4d8ec6e`` (#1152 not merged): the fixed 12:1 MLA packing, the
replay-commit verify workspace (#1156) and state groups read from the plan (#1178, the same
groups)."""

REVISIONS: Final[Mapping[str, TokenspeedRevision]] = MappingProxyType(
    {revision.name: revision for revision in (PR1152, MAIN)}
)
"""The revisions k3layout follows, oldest first (the last is the default)."""

TOKENSPEED_VERSIONS: Final = tuple(REVISIONS)
"""Their names, oldest first: ``EngineFacts.versions``."""

NEWEST: Final = REVISIONS[TOKENSPEED_VERSIONS[-1]]
"""The revision a deployment naming none plans for."""


def revision_of(deployment: Deployment) -> TokenspeedRevision:
    """The revision ``deployment`` plans for: its ``engine_version``, else the newest. A
    deployment of another engine (a tokenspeed rule asked directly) gets the newest."""
    expect_args(("deployment", deployment, Deployment))
    if deployment.engine == "tokenspeed" and deployment.engine_version is not None:
        return REVISIONS[deployment.engine_version]
    return NEWEST


__all__ = [
    "MAIN",
    "NEWEST",
    "PR1152",
    "REPOSITORY",
    "REVISIONS",
    "TOKENSPEED_VERSIONS",
    "TokenspeedRevision",
    "revision_of",
]
