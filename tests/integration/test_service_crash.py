"""``disaggctl serve`` killed with SIGKILL mid-burst, then restarted on the same ledger
(docs/design.md "Serve runtime", cluster/ledger/holds.py "Crash safety").

The service runs as a subprocess in its own session (so the test can kill its whole process
group at once, like a node losing power), with a users file of two bidders and a config whose
auction queues and auctions almost everything (``queue_threshold: 1``, ``max_in_prefill: 2``).
A burst of bidding requests, streaming and not, is cut by ``killpg(SIGKILL)`` of the service's
group followed at once by SIGKILL of every other process of its session: Ray's worker processes
(the actors, the Serve proxy and replica) each run in a process group of their own, so the group
kill alone leaves them serving for a moment, and they finish the requests in flight before they
notice their raylet is gone; killing them too is the power cut. Its NATS watchdog (a session of
its own) is left to notice the death by itself. Then:

1. the ledger file, opened cold (its replay checks every running balance and hold), holds
   exactly the money the clients saw: each request answered to the client has its hold captured
   for the payment in its body (``disagg.payment``; auctioned) or released (FCFS, payment 0),
   or, admitted FCFS by its ingress replica under the auction's lease, no hold at all;
   a request refused at admission (402) or never sent has no hold; a request refused after
   admission has no capture. The one ambiguity is a request in flight at the kill: the server
   captures at the first token, before the answer completes, so a request whose response the
   kill cut may be captured. The per-user journal sum
   is therefore exactly (client-seen payments) + (captures of requests cut in flight), every
   capture is ≤ its hold (the bid), and S_i + H_i ≤ B_i;
2. nothing of the killed service is left after a grace period: its NATS watchdog stopped the
   nats-server and removed its store by itself; survivors, if any, are killed by pid (only this
   service's: its session, its Ray temp folder, its NATS watchdog and server) and the test fails
   naming them. ``ray stop`` is never used (it would kill every Ray session on the machine);
3. a second service on the same ledger releases every hold left open (their requests were never
   answered), keeps what was captured, and charges new requests normally;
4. SIGTERM stops it with exit status 0 and nothing of its session left behind.

Requests are matched to the ledger's holds by (user, bid): every bid in this test is distinct.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.ledger.sqlite import Ledger
from cluster.nats_server import free_port
from cluster.serve.users import hash_key

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VENV_BIN = Path(sys.executable).parent
MODEL = "disagg-tiny"
KEYS = {"alice": "sk-crash-alice-0123456789", "bob": "sk-crash-bob-0123456789"}
BUDGETS = {"alice": 1.0, "bob": 0.8}  # tight: bids queued together meet 402s
CONFIG = """\
profile: b200-llama70b-fp8-tp4
topology: 1P/2D
speedup: 0.5
namespace: crash
ledger_path: {ledger}
allow_anonymous: false
auction: {{queue_threshold: 1, max_in_prefill: 2, batch_size: 8, batch_window_ms: 20}}
admission: {{hold_grace_s: 5.0}}
"""
# The holds' grace (admission.hold_grace_s, 60 s by default) is shorter here than a restart
# takes (~30 s), so the restarted auction finds every dead replica's hold expired and releases
# it at start; the grace itself is tests/cluster/test_hold_expiry.py.
MAX_TOKENS = 24  # ~0.2 s of decode at speedup 0.5, plus queueing behind the auction
BURST = 48
# Requests leave in clumps of CLUMP every CLUMP × 40 ms: more at once than the release slots
# (max_in_prefill: 2) a replica's lease holds, so each clump overflows into the auction and
# its batches are contested (a lone bidder pays 0). One by one every 40 ms, the slots often
# kept up and the auction priced nothing.
CLUMP = 4
START_TIMEOUT_S = 90.0  # Ray + Serve start in ~15 s; far more on a loaded 2-core box
MICRO = 1e-6
_RAY_DIR = re.compile(r"(/tmp/r[A-Za-z0-9_]+)/session_")
_HEX_ID = re.compile(r"^[0-9a-f]{32}$")


# ---- processes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    cmdline: str


def processes() -> list[Proc]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            raw = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        f = stat[stat.rindex(")") + 2 :].split()
        cmd = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        out.append(Proc(int(name), int(f[1]), int(f[2]), int(f[3]), f[0], cmd))
    return out


def describe(procs: list[Proc]) -> str:
    return "; ".join(f"{p.pid} [{p.state}] {p.cmdline[:140]}" for p in procs) or "none"


class ServeProcess:
    """One ``disaggctl serve`` in its own session. ``owned()``: its live processes, found by
    session id, by its Ray temp folder in their command line, and by ``--owner-pid`` (NATS)."""

    def __init__(self, workdir: Path, *, config: Path, users: Path, tag: str) -> None:
        self.workdir, self.config, self.users, self.tag = workdir, config, users, tag
        self.binds_lost = 0  # launches whose ports another process took first (wait_serving)
        self._launch()

    def _launch(self) -> None:
        workdir, config, users, tag = self.workdir, self.config, self.users, self.tag
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.stdout_path = workdir / f"serve-{tag}.out"
        self.stderr_path = workdir / f"serve-{tag}.err"
        self.ray_tmpdir_env = tempfile.mkdtemp(prefix="r", dir="/tmp")
        self.ray_dirs: set[str] = set()
        env = {
            **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},  # never join another Ray
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TMPDIR": self.ray_tmpdir_env,
            "PYTHONUNBUFFERED": "1",
        }
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.popen = subprocess.Popen(
                [
                    str(VENV_BIN / "disaggctl"),
                    "serve",
                    "--config",
                    str(config),
                    "--users",
                    str(users),
                    "--port",
                    str(self.port),
                    "--metrics-port",
                    str(self.metrics_port),
                ],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(workdir),
                start_new_session=True,
            )
        self.pid = self.popen.pid  # its session id and process group id

    def stderr_tail(self, n: int = 4000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.stdout_path.read_text(errors="replace").splitlines():
                if line.startswith("serving "):
                    self.learn_ray_dirs()
                    return line
            if self.popen.poll() is not None:
                # free_port() only finds a port free now; another process may bind it before
                # the service does. That race is the harness's, not the service's: new ports.
                if "Failed to bind to address" in self.stderr_tail() and self.binds_lost < 2:
                    self.binds_lost += 1
                    self.clean()
                    self._launch()
                    continue
                raise AssertionError(
                    f"disaggctl serve exited ({self.popen.returncode}) before serving:\n"
                    + self.stderr_tail()
                )
            time.sleep(0.2)
        raise AssertionError(f"no 'serving' line within {timeout_s} s:\n{self.stderr_tail()}")

    def learn_ray_dirs(self) -> None:
        for p in processes():
            if p.sid == self.pid:
                self.ray_dirs.update(m.group(1) for m in _RAY_DIR.finditer(p.cmdline))

    def owned(self) -> list[Proc]:
        owner, store = f"--owner-pid {self.pid} ", f"/tmp/disagg-nats-{self.pid}-"
        procs = [p for p in processes() if p.pid != os.getpid() and p.state != "Z"]
        nats = {p.pid for p in procs if owner in p.cmdline + " " or store in p.cmdline}
        return [
            p
            for p in procs
            if p.sid == self.pid
            or p.pid in nats
            or p.ppid in nats
            or any(d + "/" in p.cmdline for d in self.ray_dirs)
        ]

    def wait_gone(self, timeout_s: float) -> list[Proc]:
        deadline = time.monotonic() + timeout_s
        while (left := self.owned()) and time.monotonic() < deadline:
            time.sleep(0.25)
        return left

    def nats_stores(self, wait_s: float) -> list[str]:
        """Its embedded NATS server's store folders still on disk (after ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        while True:
            left = [str(p) for p in Path("/tmp").glob(f"disagg-nats-{self.pid}-*")]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.25)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)

    def kill_everything(self) -> int:
        """A power cut: SIGKILL its process group, then at once every other process of its
        session (Ray's workers run in groups of their own, and would otherwise finish what they
        hold before they notice their raylet is gone). Returns how many were signalled."""
        self.kill_group()
        n = 0
        for p in self.owned():
            if p.sid != self.pid:
                continue  # its NATS watchdog (own session) must notice the death by itself
            try:
                os.kill(p.pid, signal.SIGKILL)
                n += 1
            except (ProcessLookupError, PermissionError):
                pass
        return n

    def clean(self) -> list[Proc]:
        """SIGKILL what is left of it, by pid and only its own; remove its Ray folders."""
        if self.popen.poll() is None:
            self.kill_group()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        left = self.owned()
        for p in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, signal.SIGKILL)
        for d in [*self.ray_dirs, self.ray_tmpdir_env,
                  *Path("/tmp").glob(f"disagg-nats-{self.pid}-*")]:  # fmt: skip
            shutil.rmtree(d, ignore_errors=True)
        return left


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    ledger = tmp_path / "ledger.sqlite"
    config = tmp_path / "serve.yaml"
    config.write_text(CONFIG.format(ledger=ledger))
    users = tmp_path / "users.yaml"
    users.write_text(
        "users:\n"
        + "".join(
            f"  - {{name: {u}, key_sha256: {hash_key(k)}, budget: {BUDGETS[u]}}}\n"
            for u, k in KEYS.items()
        )
    )
    yield tmp_path, config, users


# ---- the client ------------------------------------------------------------------------------


@dataclass
class Sent:
    k: int
    user: str
    bid: float
    stream: bool
    outcome: str = "pending"  # answered | refused | cut | unsent
    status: int | None = None
    request_id: str | None = None
    payment: float | None = None
    mode: str | None = None
    detail: str = ""

    @property
    def micros(self) -> int:
        return round(self.bid / MICRO)


def _app_request_id(headers: httpx.Headers) -> str | None:
    # The app names its request id x-disagg-request-id (Ray Serve keeps x-request-id).
    return next((v for v in headers.get_list("x-disagg-request-id") if _HEX_ID.match(v)), None)


PROMPTS = [
    "You are a terse assistant. Summarise the history of the printing press.",
    "You are a terse assistant. Explain how a transistor works.",
    "List five prime numbers and explain why each is prime.",
]


async def send(client: httpx.AsyncClient, url: str, r: Sent) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{PROMPTS[r.k % 3]} (#{r.k})"}],
        "max_tokens": MAX_TOKENS,
        "bid": r.bid,
        "stream": r.stream,
    }
    if r.stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {KEYS[r.user]}"}
    reached = False
    try:
        if not r.stream:
            resp = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            reached = True
            r.status, r.request_id = resp.status_code, _app_request_id(resp.headers)
            if resp.status_code != 200:
                r.outcome, r.detail = "refused", resp.text[:200]
                return
            disagg = resp.json()["disagg"]
            r.payment, r.mode, r.outcome = float(disagg["payment"]), disagg["mode"], "answered"
            return
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers
        ) as resp:
            reached = True
            r.status, r.request_id = resp.status_code, _app_request_id(resp.headers)
            if resp.status_code != 200:
                await resp.aread()
                r.outcome, r.detail = "refused", resp.text[:200]
                return
            last: dict[str, Any] | None = None
            done = False
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    r.outcome, r.detail = "refused", data[:200]  # failed after admission
                    return
                if chunk.get("disagg") is not None:
                    last = chunk["disagg"]
            if done and last is not None:
                r.payment, r.mode, r.outcome = float(last["payment"]), last["mode"], "answered"
            else:
                r.outcome, r.detail = "cut", "stream ended without [DONE]"
    except httpx.ConnectError as exc:
        # Refused at connect: nothing reached the server (after the kill).
        r.outcome, r.detail = ("cut" if reached else "unsent"), repr(exc)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        r.outcome, r.detail = "cut", repr(exc)


def plan(first_k: int, n: int, base_micros: int, step_micros: int) -> list[Sent]:
    """n requests alternating users, every third streaming, each bid distinct."""
    return [
        Sent(
            k=first_k + i,
            user="alice" if i % 2 == 0 else "bob",
            bid=(base_micros + step_micros * (first_k + i)) * MICRO,
            stream=i % 3 == 1,
        )
        for i in range(n)
    ]


async def burst_then_kill(svc: ServeProcess, sent: list[Sent]) -> dict[str, Any]:
    """Fire ``sent`` in clumps of ``CLUMP``; SIGKILL the service's group once enough are
    answered, some auctioned answer paid, and enough are in flight (or at a deadline). What
    the client saw, request by request."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits) as client:
        tasks: list[asyncio.Task[None]] = []
        killed_at = None
        t0 = time.monotonic()
        deadline = t0 + 20.0
        i, tick = 0, 0
        while True:
            if i < len(sent) and killed_at is None and tick % CLUMP == 0:
                for r in sent[i : i + CLUMP]:
                    tasks.append(asyncio.create_task(send(client, svc.url, r)))
                i = min(i + CLUMP, len(sent))
            tick += 1
            answered = sum(r.outcome == "answered" for r in sent)
            paid = any(r.mode == "auction" and (r.payment or 0) > 0 for r in sent)
            in_flight = sum(not t.done() for t in tasks)
            if killed_at is None and (
                (answered >= 12 and paid and in_flight >= 6) or time.monotonic() > deadline
            ):
                # Mid-burst: the CLI, its Ray head and, at once, every actor of its session.
                signalled = svc.kill_everything()
                killed_at = time.monotonic() - t0
                in_flight_at_kill = in_flight
                break
            await asyncio.sleep(0.04)
        await asyncio.wait(tasks, timeout=30.0)
        for t in tasks:
            t.cancel()
        for r in sent[i:]:
            r.outcome, r.detail = "unsent", "after the kill"
    return {"killed_at_s": round(killed_at, 2), "in_flight_at_kill": in_flight_at_kill,
            "launched": i, "signalled_outside_the_group": signalled}  # fmt: skip


async def run_requests(url: str, sent: list[Sent]) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:
        await asyncio.gather(*(send(client, url, r) for r in sent))


# ---- the ledger ------------------------------------------------------------------------------


def ledger_view(path: Path) -> dict[str, Any]:
    """Holds, journal and accounts of the ledger file, opened cold (its replay checks run)."""
    with Ledger(path) as ledger:
        return {
            "holds": ledger.holds(),
            "open": ledger.holds(state="open"),
            "journal": ledger.journal(),
            "accounts": {a.user: a for a in ledger.accounts()},
            "held": {u: ledger.held(u) for u in BUDGETS},
        }


def match_holds(view: dict[str, Any], sent: list[Sent]) -> dict[str, Sent]:
    """hold_id → the request it belongs to, by (user, bid); AssertionError for a stranger."""
    by_key = {(r.user, r.micros): r for r in sent}
    assert len(by_key) == len(sent), "bids must be distinct per user"
    out = {}
    for h in view["holds"]:
        r = by_key.get((h.user, round(h.amount / MICRO)))
        assert r is not None, f"hold {h} matches no request this test sent"
        assert r.request_id is None or h.hold_id.startswith(r.request_id + "@"), (
            f"hold {h.hold_id} has the bid of request {r.request_id} but not its id"
        )
        out[h.hold_id] = r
    assert len(set(map(id, out.values()))) == len(out), "two holds for one request"
    return out


def check_books(view: dict[str, Any], sent: list[Sent], *, after_restart: bool) -> dict[str, Any]:
    """The money checks shared by the crash and the restart (module docstring, point 1)."""
    holds = {h.hold_id: h for h in view["holds"]}
    owner = match_holds(view, sent)
    journal = view["journal"]
    captures = {c.hold_id: c for c in journal}
    assert all(c.hold_id for c in journal), f"a plain charge in a serve ledger: {journal}"
    problems: list[str] = []
    held_by = {r.k: hid for hid, r in owner.items()}
    for r in sent:
        hid = held_by.get(r.k)
        hold = holds.get(hid) if hid else None
        if r.outcome == "answered":
            if hold is None:
                # Admitted FCFS under its replica's lease: no hold, no ledger write, no charge.
                if r.mode != "fcfs" or (r.payment or 0.0) != 0.0:
                    problems.append(f"answered request {r.k} ({r.request_id}) has no hold")
            elif r.mode == "auction":
                c = captures.get(hid)
                if hold.state != "captured" or c is None:
                    problems.append(f"answered auctioned request {r.k} paid {r.payment} "
                                    f"but its hold is {hold.state}")  # fmt: skip
                elif abs(c.amount - (r.payment or 0.0)) > MICRO:
                    problems.append(f"request {r.k}: client saw payment {r.payment}, ledger "
                                    f"captured {c.amount}")  # fmt: skip
            elif hold.state != "released" or (r.payment or 0.0) != 0.0:
                problems.append(f"answered FCFS request {r.k}: payment {r.payment}, "
                                f"hold {hold.state}")  # fmt: skip
        elif r.outcome in ("refused", "unsent"):
            if hold is not None and hold.state == "captured":
                problems.append(f"{r.outcome} request {r.k} (status {r.status}) was charged "
                                f"{captures[hid].amount}")  # fmt: skip
            refused_early = r.outcome == "unsent" or r.status in (400, 401, 402, 413)
            if refused_early and hold is not None:
                problems.append(f"request {r.k} refused before admission "
                                f"({r.outcome}, {r.status}) has a hold {hold}")  # fmt: skip
        if hold is not None and hold.state == "open" and (after_restart or r.outcome != "cut"):
            problems.append(f"request {r.k} ({r.outcome}) left hold {hid} open")
    for hid, c in captures.items():
        assert hid in holds, f"capture {c} of an unknown hold"
        assert c.amount <= holds[hid].amount + MICRO, f"capture {c} above its hold (the bid)"
    assert not problems, "ledger vs client:\n" + "\n".join(problems)

    seen = Counter[str]()
    cut_captured = Counter[str]()
    for hid, c in captures.items():
        r = owner[hid]
        if r.outcome == "answered":
            seen[c.user] += c.amount
        else:
            cut_captured[c.user] += c.amount
    summary: dict[str, Any] = {"users": {}}
    for user, budget in BUDGETS.items():
        acct = view["accounts"][user]
        client_paid = sum(r.payment or 0.0 for r in sent if r.user == user
                          and r.outcome == "answered")  # fmt: skip
        journal_sum = sum(c.amount for c in journal if c.user == user)
        assert abs(acct.spent - journal_sum) < MICRO * (1 + len(journal))
        assert abs(journal_sum - (client_paid + cut_captured[user])) < MICRO * (1 + len(journal)), (
            f"{user}: journal {journal_sum} != client-seen {client_paid} + captures of requests "
            f"cut in flight {cut_captured[user]}"
        )
        assert acct.budget == budget
        assert acct.spent + view["held"][user] <= budget + MICRO, f"{user} over budget: {acct}"
        summary["users"][user] = {
            "spent": round(acct.spent, 6), "held": view["held"][user],
            "client_paid": round(client_paid, 6),
            "captured_but_cut": round(cut_captured[user], 6),
        }  # fmt: skip
    summary["holds"] = dict(Counter(h.state for h in view["holds"]))
    summary["outcomes"] = dict(Counter(r.outcome for r in sent))
    summary["cut_captured"] = sum(1 for hid in captures if owner[hid].outcome == "cut")
    summary["open_holds_of_cut"] = sorted(
        owner[h.hold_id].k for h in view["holds"] if h.state == "open"
    )
    return summary


# ---- the test --------------------------------------------------------------------------------


def test_sigkill_mid_burst_then_restart_keeps_money_exact(
    workdir: tuple[Path, Path, Path],
) -> None:
    report: dict[str, Any] = {}
    try:
        _scenario(workdir, report)
    finally:
        print(json.dumps(report, indent=1, default=str))


def _scenario(workdir: tuple[Path, Path, Path], report: dict[str, Any]) -> None:
    tmp, config, users = workdir
    ledger_path = tmp / "ledger.sqlite"
    t_start = time.monotonic()

    # -- 1. serve, burst, SIGKILL the whole group mid-burst ------------------------------------
    first = ServeProcess(tmp, config=config, users=users, tag="1")
    try:
        first.wait_serving()
        report["start1_s"] = round(time.monotonic() - t_start, 1)
        assert first.ray_dirs, f"no Ray temp folder found among {describe(first.owned())}"
        # First a bid above alice's whole budget: refused at admission (402), nothing held.
        over = Sent(k=999, user="alice", bid=BUDGETS["alice"] + 0.234567, stream=False)
        sent = [over, *plan(0, BURST, base_micros=50_000, step_micros=3_001)]
        report["burst"] = asyncio.run(burst_then_kill(first, sent))
        assert first.popen.wait(timeout=10) == -signal.SIGKILL
        survivors = first.wait_gone(20.0)
        nats_stores = first.nats_stores(wait_s=5.0)
    finally:
        killed = first.clean()
    report["survivors_after_sigkill"] = describe(killed)
    assert (over.outcome, over.status) == ("refused", 402), over
    answered = [r for r in sent if r.outcome == "answered"]
    assert len(answered) >= 5, f"too few answers before the kill: {sent}"
    assert any(r.mode == "auction" and (r.payment or 0) > 0 for r in answered), (
        f"no auctioned request paid anything; the test proves little: {answered}"
    )

    # -- 2. the ledger, cold, against what the clients saw -------------------------------------
    crashed = ledger_view(ledger_path)
    report["after_crash"] = check_books(crashed, sent, after_restart=False)
    open_before = {h.hold_id for h in crashed["open"]}

    # -- 3. restart on the same ledger ----------------------------------------------------------
    t_second = time.monotonic()
    second = ServeProcess(tmp, config=config, users=users, tag="2")
    try:
        second.wait_serving()
        report["start2_s"] = round(time.monotonic() - t_second, 1)
        restarted = ledger_view(ledger_path)
        assert restarted["open"] == [], f"holds still open after the restart: {restarted['open']}"
        states = {h.hold_id: h.state for h in restarted["holds"]}
        assert all(states[hid] == "released" for hid in open_before), states
        assert restarted["journal"] == crashed["journal"], "the restart changed the journal"
        check_books(restarted, sent, after_restart=True)

        more = plan(1000, 8, base_micros=1_000, step_micros=7)
        asyncio.run(run_requests(second.url, more))
        assert all(r.outcome == "answered" for r in more), [
            (r.k, r.outcome, r.status, r.detail) for r in more if r.outcome != "answered"
        ]
        final = ledger_view(ledger_path)
        report["after_restart"] = check_books(final, [*sent, *more], after_restart=True)
        new_caps = final["journal"][len(crashed["journal"]) :]
        assert final["journal"][: len(crashed["journal"])] == crashed["journal"]
        assert round(sum(c.amount for c in new_caps), 6) == round(
            sum(r.payment or 0.0 for r in more), 6
        )
        assert any(r.mode == "auction" for r in more), [r.mode for r in more]

        # -- 4. SIGTERM: exit 0, nothing left ---------------------------------------------------
        t_stop = time.monotonic()
        second.popen.send_signal(signal.SIGTERM)
        try:
            rc = second.popen.wait(timeout=45)
        except subprocess.TimeoutExpired:
            rc = None
        report["stop_s"] = round(time.monotonic() - t_stop, 1)
        left = second.wait_gone(15.0)
        # Files are not processes: reported, not failed (Service.stop does not remove the
        # Ray temp folder that init_ray made for it).
        report["ray_tmpdir_left_after_sigterm"] = [d for d in second.ray_dirs if Path(d).exists()]
        assert rc == 0, f"SIGTERM: exit status {rc}, stderr:\n{second.stderr_tail()}"
        assert not left, f"processes left after a clean stop: {describe(left)}"
    finally:
        killed2 = second.clean()
    report["left_after_sigterm"] = describe(killed2)
    report["total_s"] = round(time.monotonic() - t_start, 1)
    assert not survivors, (
        "after SIGKILL of the service's process group these processes outlived it (killed by "
        f"pid now): {describe(survivors)}"
    )
    assert not nats_stores, f"the killed service's NATS store was not removed: {nats_stores}"
