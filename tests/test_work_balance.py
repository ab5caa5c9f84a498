"""The work-balanced sampler: every rank agrees on each step's split, the global batch is the one
equal counts take, each rank's work is its share of the step's work, and what the model learns
does not change (in one process by hand, and with a real 4-rank gloo DDP job whose loss at
every step equals the equal-count run's)."""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from conftest import free_port
from skewtrace import semconv
from skewtrace.rank.rebalance_sampler import batch_sizes
from skewtrace.rank.work_balance import WorkBalancedSampler
from skewtrace.remedy.work_split import CostFit, TokenCost
from work_balance_job import JobConfig, Sequences, TinyTransformer, run_rank

WORLD = 4


def _lengths(count: int, seed: int = 0, median: float = 512.0) -> list[int]:
    rng = random.Random(seed)
    return [
        int(min(8192, max(16, rng.lognormvariate(math.log(median), 1.0)))) for _ in range(count)
    ]


def _samplers(count: int, batch: int, **kwargs: Any) -> list[WorkBalancedSampler]:
    return [
        WorkBalancedSampler(count, batch, num_replicas=WORLD, rank=r, **kwargs)
        for r in range(WORLD)
    ]


def _passes(samplers: Sequence[WorkBalancedSampler]) -> list[list[list[int]]]:
    """Every rank's batches of one pass: [rank][step] -> indices."""
    return [list(s) for s in samplers]


CROSSOVER = TokenCost.with_crossover(2048)


# ------------------------------------------------------------------ the split


def test_every_rank_computes_the_same_split_and_an_epoch_covers_every_index_once() -> None:
    lengths = _lengths(64 * 5 + 9)
    for mode in ("work", "count"):
        samplers = _samplers(len(lengths), 64, lengths=lengths, cost=CROSSOVER, mode=mode, seed=3)
        for epoch in (0, 1):
            for s in samplers:
                s.set_epoch(epoch)
            batches = _passes(samplers)
            assert {len(b) for b in batches} == {len(samplers[0])} == {6}
            seen = [i for rank in batches for step in rank for i in step]
            assert sorted(seen) == list(range(len(lengths)))
            for index in range(6):
                plans = [s.step_plan(index) for s in samplers]
                # Every rank's plan of the step agrees on the whole split.
                assert len({(p.global_indices, p.sizes, p.work) for p in plans}) == 1
                # The global batch is exactly the next slice of the permutation, as equal
                # counts (ShareSampler) take it.
                order = samplers[0]._order()
                assert plans[0].global_indices == tuple(order[index * 64 : (index + 1) * 64])
                assert sorted(i for p in plans for i in p.indices) == sorted(
                    plans[0].global_indices
                )
                assert [len(p.indices) for p in plans] == list(plans[0].sizes)


def test_count_mode_is_equal_counts_and_work_mode_is_equal_work_within_the_lpt_bound() -> None:
    lengths = _lengths(64 * 20)
    counts = _samplers(len(lengths), 64, lengths=lengths, cost=CROSSOVER, mode="count")
    works = _samplers(len(lengths), 64, lengths=lengths, cost=CROSSOVER)
    _passes(counts)
    _passes(works)
    count_excess, work_excess = [], []
    for index in range(20):
        count_plan, work_plan = counts[0].step_plan(index), works[0].step_plan(index)
        assert count_plan.sizes == (16, 16, 16, 16)
        assert count_plan.global_indices == work_plan.global_indices
        costs = [CROSSOVER(counts[0].tokens(i)) for i in work_plan.global_indices]
        mean = sum(costs) / WORLD
        # LPT: no part exceeds the mean by more than the largest single sample.
        assert max(work_plan.work) <= mean + max(costs) + 1e-9
        assert sum(work_plan.work) == pytest.approx(sum(costs))
        count_excess.append(max(count_plan.work) / mean)
        work_excess.append(max(work_plan.work) / mean)
        # Above the mean only where one sample alone is more than a rank's share.
        assert max(work_plan.work) <= max(1.02 * mean, max(costs) + 1e-9)
    # On log-normal lengths (sigma 1) equal counts leave a rank far above the mean.
    assert sorted(count_excess)[10] > 1.2
    assert sorted(work_excess)[10] < 1.01
    assert sum(work_excess) < sum(count_excess)


class _Source:
    """Rank 0's controller: shares and a balance mode, or a failure."""

    def __init__(
        self,
        shares: Mapping[int, float] | None = None,
        balance: Any = ("work", 7),
        raises: bool = False,
    ) -> None:
        self.shares, self.balance, self.raises = shares, balance, raises
        self.reads = 0

    def current_shares(self) -> tuple[Mapping[int, float] | None, int]:
        return self.shares, 3 if self.shares else 0

    def current_balance(self) -> tuple[str | None, int]:
        self.reads += 1
        if self.raises:
            raise RuntimeError("pacer down")
        mode, version = self.balance
        return mode, version


def test_shares_by_speed_compose_with_samples_by_work() -> None:
    lengths = _lengths(64 * 10, seed=5)
    shares = {0: 0.1, 1: 0.3, 2: 0.3, 3: 0.3}
    samplers = _samplers(len(lengths), 64, lengths=lengths, cost=CROSSOVER, source=_Source(shares))
    _passes(samplers)
    for index in range(10):
        plan = samplers[0].step_plan(index)
        costs = [CROSSOVER(samplers[0].tokens(i)) for i in plan.global_indices]
        total = sum(costs)
        for rank, share in shares.items():
            # Each rank's work is its share of the step's work, within one sample.
            assert abs(plan.work[rank] - share * total) <= max(costs) + 1e-9
        assert plan.work[0] < min(plan.work[1:])
    # Count mode with the same shares is ShareSampler's split: sizes by the shares.
    counts = _samplers(
        len(lengths), 64, lengths=lengths, cost=CROSSOVER, mode="count", source=_Source(shares)
    )
    _passes(counts)
    assert counts[0].step_plan(0).sizes == tuple(batch_sizes(list(shares.values()), 64))


def test_microbatches_split_each_rank_into_equal_work_parts() -> None:
    lengths = _lengths(64 * 3, seed=2)
    samplers = _samplers(len(lengths), 64, lengths=lengths, cost=CROSSOVER, microbatches=4)
    batches = _passes(samplers)
    for rank, s in enumerate(samplers):
        for index in range(3):
            plan = s.step_plan(index)
            slices = s.microbatch_slices(index)
            assert len(slices) == 4 and all(sl.stop > sl.start for sl in slices)
            assert list(plan.indices) == batches[rank][index]
            parts = [sum(CROSSOVER(s.tokens(i)) for i in plan.indices[sl]) for sl in slices]
            costs = [CROSSOVER(s.tokens(i)) for i in plan.global_indices]
            assert max(parts) <= sum(costs) / 16 + max(costs) + 1e-9
    # Count mode: consecutive equal slices of each rank's equal share.
    counts = _samplers(len(lengths), 64, lengths=lengths, mode="count", microbatches=4)
    _passes(counts)
    assert [sl.stop - sl.start for sl in counts[1].microbatch_slices(0)] == [4, 4, 4, 4]


def test_token_scale_and_global_tokens() -> None:
    lengths = _lengths(100)
    (sampler,) = [WorkBalancedSampler(100, 20, lengths=lengths, num_replicas=2, rank=1)]
    list(sampler)
    plan = sampler.step_plan(4)
    assert sampler.global_tokens(4) == sum(lengths[i] for i in plan.global_indices)
    assert sampler.local_tokens(4) == sum(lengths[i] for i in plan.indices)
    assert sampler.token_loss_scale(4) == pytest.approx(2 / sampler.global_tokens(4))
    minus_one = sampler.global_tokens(4, per_sample=lambda i: lengths[i] - 1)
    assert minus_one == sampler.global_tokens(4) - 20
    with pytest.raises(KeyError, match="enumerate"):
        sampler.step_plan(5)
    # A callable length works too.
    by_call = WorkBalancedSampler(100, 20, lengths=lambda i: lengths[i], num_replicas=2, rank=1)
    assert list(by_call) == [list(sampler.step_plan(i).indices) for i in range(5)]


# ------------------------------------------------------------------ the mode and failing open


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (_Source(balance=("work", 7)), ("work", 7)),
        (_Source(balance=("count", 8)), ("count", 8)),
        (_Source(balance=(None, 9)), ("count", 9)),  # the controller says nothing: count
        (_Source(balance=("fast", 2)), ("count", 2)),  # unknown mode: count
        (_Source(raises=True), ("count", 0)),  # failing: count
        (object(), ("count", 0)),  # no current_balance (an older client): count
        (None, ("count", 0)),  # no session, no source: count
    ],
)
def test_pacer_mode_takes_the_controllers_mode_and_fails_open_to_count(
    source: Any, expected: tuple[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    lengths = _lengths(64)
    sampler = WorkBalancedSampler(
        64, 16, lengths=lengths, num_replicas=WORLD, rank=0, mode="pacer", source=source
    )
    with caplog.at_level(logging.WARNING):
        list(sampler)
        list(sampler)
    assert sampler.balance == expected
    assert sampler.step_plan(0).mode == expected[0]
    assert sampler.skewtrace_balance_tag(0) == (*expected, 0)
    assert sampler.skewtrace_balance_tag(99) is None
    if isinstance(source, _Source) and source.raises:
        assert sum("balance mode failed" in r.message for r in caplog.records) == 1


def test_only_sync_points_change_the_mode() -> None:
    source = _Source(balance=("count", 1))
    sampler = WorkBalancedSampler(
        16 * 8,
        16,
        lengths=_lengths(128),
        num_replicas=WORLD,
        rank=0,
        mode="pacer",
        source=source,
        sync_every=3,
    )
    modes = []
    for index, _ in enumerate(sampler):
        modes.append(sampler.step_plan(index).mode)
        source.balance = ("work", 2)
    assert modes == ["count"] * 3 + ["work"] * 5
    assert source.reads == 3  # steps 0, 3, 6


def test_bad_arguments_say_what_is_wrong() -> None:
    lengths = _lengths(64)
    with pytest.raises(ValueError, match="mode must be one of"):
        WorkBalancedSampler(64, 16, lengths=lengths, num_replicas=4, rank=0, mode="tokens")
    with pytest.raises(ValueError, match="microbatches"):
        WorkBalancedSampler(64, 16, lengths=lengths, num_replicas=4, rank=0, microbatches=0)
    with pytest.raises(ValueError, match="ranks x micro-batches"):
        WorkBalancedSampler(64, 16, lengths=lengths, num_replicas=4, rank=0, microbatches=5)
    with pytest.raises(ValueError, match="lengths has 10 entries"):
        WorkBalancedSampler(64, 16, lengths=lengths[:10], num_replicas=4, rank=0)
    with pytest.raises(TypeError, match="cost must be a TokenCost"):
        WorkBalancedSampler(64, 16, lengths=lengths, num_replicas=4, rank=0, cost=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank 4 is not in"):
        WorkBalancedSampler(64, 16, lengths=lengths, num_replicas=4, rank=4)
    sampler = WorkBalancedSampler(64, 16, lengths=lambda i: -1.0, num_replicas=4, rank=0)
    with pytest.raises(ValueError, match="finite >= 0"):
        list(sampler)


# ------------------------------------------------------------------ the cost model


def test_the_online_fit_recovers_the_cost_and_is_adopted_at_a_sync_point() -> None:
    a, b = 2e-5, 2e-5 / 1024  # quadratic equal to linear at 1,024 tokens
    truth = TokenCost(a, b)
    lengths = _lengths(64 * 8, seed=4, median=256)
    sampler = WorkBalancedSampler(
        len(lengths),
        64,
        lengths=lengths,
        num_replicas=WORLD,
        rank=1,
        sync_every=2,
        fit_min_observations=4,
    )
    versions = []
    for index, _batch in enumerate(sampler):
        versions.append(sampler.step_plan(index).cost_version)
        # What the forward took: the true cost of the rank's batch (plus a fixed 1 ms).
        plan = sampler.step_plan(index)
        assert sampler.observe(truth.of_batch([lengths[i] for i in plan.indices]) + 1e-3)
    assert versions[:4] == [0, 0, 0, 0]  # the default (linear) until enough observations
    assert versions[-1] >= 1
    fitted = sampler.cost
    assert fitted.linear == pytest.approx(a, rel=1e-6)
    assert fitted.quadratic == pytest.approx(b, rel=1e-6)
    assert not sampler.observe(1.0)  # nothing pending any more
    # A fixed cost is never refitted.
    fixed = WorkBalancedSampler(64, 16, lengths=lengths[:64], num_replicas=4, rank=0, cost=truth)
    next(iter(fixed))
    assert not fixed.observe(1.0)


def test_time_forward_observes_training_forwards_only() -> None:
    lengths = _lengths(32, median=64)
    sampler = WorkBalancedSampler(32, 8, lengths=lengths, num_replicas=2, rank=0)
    model = nn.Linear(2, 2)
    remove = sampler.time_forward(model)
    batches = iter(sampler)
    next(batches)
    next(batches)
    model(torch.zeros(1, 2))
    model.eval()
    model(torch.zeros(1, 2))  # not observed
    model.train()
    model(torch.zeros(1, 2))
    assert sampler._fit.observations == 2
    assert not sampler._pending
    remove()
    model(torch.zeros(1, 2))
    assert sampler._fit.observations == 2


def test_merged_statistics_give_one_model_for_all() -> None:
    fits = [CostFit(min_observations=3) for _ in range(WORLD)]
    rng = random.Random(1)
    for fit in fits:
        for _ in range(5):
            batch = [rng.randint(16, 2000) for _ in range(8)]
            fit.observe(batch, TokenCost(1e-5, 1e-8).of_batch(batch))
    summed = [sum(col) for col in zip(*(f.statistics() for f in fits), strict=True)]
    model = CostFit.merged(summed).model()
    assert model is not None and model.quadratic / model.linear == pytest.approx(1e-3, rel=1e-6)


# ------------------------------------------------------------------ spans


class _Scripted:
    """The controller's balance at its first, second, ... read (the last one from then on)."""

    def __init__(self, script: Sequence[tuple[str, int]]) -> None:
        self.script, self.reads = list(script), 0

    def current_balance(self) -> tuple[str, int]:
        found = self.script[min(self.reads, len(self.script) - 1)]
        self.reads += 1
        return found


@pytest.mark.usefixtures("unit_job", "world_of_one")
def test_each_fetch_span_carries_the_mode_of_the_batch_it_returned(
    memory_provider: Any,
) -> None:
    """With DataLoader workers the sampler runs ahead of the loop; each dataloader.fetch span
    still carries the tag of the batch that fetch returned."""
    from torch.utils.data import DataLoader

    import skewtrace
    from work_balance_job import as_list

    provider, exporter = memory_provider
    config = JobConfig(samples=8 * 12, global_batch=8)
    data = Sequences(config)
    source = _Scripted([("count", 1), ("work", 2)])
    sampler = WorkBalancedSampler(
        data, 8, lengths=data.lengths, mode="pacer", source=source, sync_every=4
    )
    loader = DataLoader(
        data, batch_sampler=sampler, collate_fn=as_list, num_workers=2, prefetch_factor=4
    )
    torch.manual_seed(0)
    model = TinyTransformer(config).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    skewtrace.instrument(
        model=model, optimizer=optimizer, dataloader=loader, tracer_provider=provider
    )
    expected = []
    for index, batch in enumerate(loader):
        expected.append(sampler.skewtrace_balance_tag(index))
        optimizer.zero_grad()
        model(batch).backward()
        optimizer.step()
    skewtrace.uninstrument()
    fetches = sorted(
        (s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_DATALOADER_FETCH),
        key=lambda s: s.attributes[semconv.STEP],
    )
    tags = [
        (
            s.attributes[semconv.BALANCE_MODE],
            s.attributes[semconv.BALANCE_VERSION],
            s.attributes[semconv.BALANCE_COST_VERSION],
        )
        for s in fetches
    ]
    assert [t[:2] for t in expected] == [("count", 1)] * 4 + [("work", 2)] * 8
    assert tags == expected


# ------------------------------------------------------------------ the update


def test_token_scaled_gradient_is_the_same_whatever_the_split() -> None:
    """Each rank's gradient of its token-loss sum times world/global tokens, averaged as DDP
    averages, equals the gradient of the mean token loss over the global batch."""
    config = JobConfig()
    data = Sequences(config)
    torch.manual_seed(0)
    model = TinyTransformer(config).double()
    results = {}
    for mode in ("count", "work"):
        samplers = _samplers(len(data), 16, lengths=data.lengths, cost=CROSSOVER, mode=mode)
        _passes(samplers)
        total = [torch.zeros_like(p) for p in model.parameters()]
        for s in samplers:
            model.zero_grad()
            batch = [data[i] for i in s.step_plan(2).indices]
            (model(batch) * s.token_loss_scale(2)).backward()
            for acc, p in zip(total, model.parameters(), strict=True):
                acc += p.grad / WORLD
        results[mode] = total
    plan = samplers[0].step_plan(2)
    model.zero_grad()
    (model([data[i] for i in plan.global_indices]) / plan.global_tokens).backward()
    full = [p.grad for p in model.parameters()]
    for a, b, c in zip(results["count"], results["work"], full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-13)
    # The splits did differ.
    counts = _samplers(len(data), 16, lengths=data.lengths, mode="count")
    _passes(counts)
    assert counts[0].step_plan(2).indices != samplers[0].step_plan(2).indices


# ------------------------------------------------------------------ real DDP over gloo

RUNS = {
    "count": ("count", JobConfig()),
    "work": ("work", JobConfig()),
    "work-shares": ("work", JobConfig(shares=(0.1, 0.3, 0.3, 0.3))),
}


def _worker(rank: int, ports: list[int], out: str) -> None:
    results = {}
    for port, (name, (mode, config)) in zip(ports, RUNS.items(), strict=True):
        results[name] = run_rank(rank, WORLD, port, config, mode)
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))


@pytest.mark.slow
def test_real_ddp_work_split_learns_exactly_what_equal_counts_learn(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    ports = [free_port() for _ in RUNS]
    mp.spawn(_worker, args=(ports, str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    count = ranks[0]["count"]
    for name in ("work", "work-shares"):
        run = ranks[0][name]
        assert len(run["loss"]) == 20
        # The loss at every step is the equal-count run's (float64: summation order only).
        assert run["loss"] == pytest.approx(count["loss"], rel=1e-9, abs=1e-12)
        for step in range(20):
            # Each step's global batch is the same samples, split differently.
            every = sorted(i for r in ranks for i in r[name]["indices"][step])
            assert every == sorted(i for r in ranks for i in r["count"]["indices"][step])
            # Every rank used the same plan (the same per-rank work and cost version).
            assert len({json.dumps(r[name]["work"][step]) for r in ranks}) == 1
            assert len({r[name]["cost_versions"][step] for r in ranks}) == 1
    assert count["loss"][-1] < count["loss"][0]

    # The work split evened the work; equal counts did not.
    def spread(run: Mapping[str, Any]) -> float:
        return sum(max(w) / (sum(w) / WORLD) for w in run["work"]) / len(run["work"])

    assert spread(ranks[0]["work"]) < spread(ranks[0]["count"])
    # The fit was adopted at a sync point (the forward times of the four ranks merged).
    assert ranks[0]["work"]["cost_versions"][-1] >= 1
    shares = ranks[0]["work-shares"]["work"][-1]
    assert shares[0] < min(shares[1:])


# ------------------------------------------------------------------ the report


def _balance_file(path: Path, modes: Sequence[str], step_ms: Sequence[float]) -> Path:
    """Two ranks' train.step and dataloader.fetch spans, each step tagged with its mode."""
    from report_fixtures import line, span_json

    lines = []
    for rank in range(2):
        resource = {semconv.JOB_ID: "balanced", semconv.RANK: rank, "host.name": "h0"}
        spans = []
        start = 1_700_000_000.0
        for step, (mode, ms) in enumerate(zip(modes, step_ms, strict=True)):
            trace = f"{step + 1:032x}"
            fetch = {semconv.STEP: step, semconv.BALANCE_MODE: mode, semconv.BALANCE_VERSION: 0}
            spans.append(span_json("dataloader.fetch", start, start + 0.001, fetch, trace_id=trace))
            end = start + ms / 1e3 * (1.0 if rank == 0 else 0.99)
            spans.append(span_json("train.step", start, end, {semconv.STEP: step}, trace_id=trace))
            start += ms / 1e3
        lines.append(line(resource, spans))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_report_shows_step_time_by_split_mode(tmp_path: Path) -> None:
    from skewtrace.report import build_report, collect
    from skewtrace.report.balance import balance_rows

    modes = ["count"] * 6 + ["work"] * 6 + ["count"] * 2
    step_ms = [500.0] + [200.0] * 5 + [160.0] * 6 + [210.0, 190.0]
    path = _balance_file(tmp_path / "spans.jsonl", modes, step_ms)
    data = collect(path)
    assert data.balance_modes == dict(enumerate(modes))
    rows = {row.mode: row for row in balance_rows(data.balance_modes, data.step_time_s)}
    # The first step (start-up) is left out.
    assert rows["count"].steps == 7 and rows["count"].mean_s == pytest.approx(0.2)
    assert rows["work"].steps == 6 and rows["work"].mean_s == pytest.approx(0.16)
    html, _ = build_report(path)
    assert '<section id="balance">' in html
    assert 'data-ratio="1.2500"' in html
    assert '<tr class="balance-mode" data-mode="work">' in html
    # One mode only: the section says so; no tagged step: no section.
    only = collect(_balance_file(tmp_path / "one.jsonl", ["work"] * 3, [100.0] * 3))
    assert "no steps of the other mode" in build_report(only.source)[0]
    assert balance_rows({}, {0: 1.0}) == []


# ------------------------------------------------------------------ a framework: Lightning


def _torchrun(script: str, out: Path, *args: str) -> None:
    """``script`` (under tests/) on 2 gloo ranks under torchrun, writing to ``out``."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(repo / "tests"), str(repo / "src")]),
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(repo / "tests" / script), "--out", str(out), *args],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def _reference_plans(mode: str = "work") -> dict[tuple[int, int, int], Any]:
    """(epoch, step, rank) -> the plan of the frameworks' job (48 samples, 16 a step, seed 5)."""
    data = Sequences(JobConfig(samples=16 * 3, global_batch=16))
    plans = {}
    for epoch in (0, 1):
        for rank in (0, 1):
            sampler = WorkBalancedSampler(
                len(data), 16, lengths=data.lengths, num_replicas=2, rank=rank, seed=5, mode=mode
            )
            sampler.set_epoch(epoch)
            list(sampler)
            for index in range(3):
                plans[epoch, index, rank] = sampler.step_plan(index)
    return plans


def _work_equals_count(script: str, tmp_path: Path) -> None:
    """``script`` by work and by count: each rank trained on its plan, epoch by epoch, the
    splits differed, and the parameters after 6 steps are the same (float64)."""
    runs = {}
    for mode in ("work", "count"):
        _torchrun(script, tmp_path / mode, "--mode", mode)
        runs[mode] = [json.loads((tmp_path / mode / f"rank{r}.json").read_text()) for r in (0, 1)]
    for mode, ranks in runs.items():
        plans = _reference_plans(mode)
        for step in range(6):
            for rank in (0, 1):
                planned = plans[step // 3, step % 3, rank].indices
                assert sorted(ranks[rank]["seen"][step]) == sorted(planned), (mode, step, rank)
    assert any(
        sorted(runs["work"][0]["seen"][s]) != sorted(runs["count"][0]["seen"][s]) for s in range(6)
    )
    for a, b in zip(runs["work"][0]["params"], runs["count"][0]["params"], strict=True):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12)


@pytest.mark.slow
@pytest.mark.eval  # 25-30 s of torchrun each: make eval (make test keeps Lightning's)
def test_transformers_trainer_without_prepare_learns_what_equal_counts_learn(
    tmp_path: Path,
) -> None:
    """transformers.Trainer (tests/work_balance_trainer.py, 2 gloo ranks under torchrun): a
    subclass's get_train_dataloader without accelerator.prepare; the Trainer's own loss
    normalization (num_items_in_batch over the devices) needs nothing more."""
    pytest.importorskip("transformers")
    _work_equals_count("work_balance_trainer.py", tmp_path)


@pytest.mark.slow
@pytest.mark.eval  # 25-30 s of torchrun each: make eval (make test keeps Lightning's)
def test_accelerate_without_preparing_the_loader_learns_what_equal_counts_learn(
    tmp_path: Path,
) -> None:
    """Accelerate (tests/work_balance_accelerate.py, 2 gloo ranks under torchrun): the model
    and the optimizer prepared, the loader not; the token loss scaled by token_loss_scale."""
    pytest.importorskip("accelerate")
    _work_equals_count("work_balance_accelerate.py", tmp_path)


@pytest.mark.slow
def test_lightning_keeps_the_batch_sampler_and_sets_its_epoch(tmp_path: Path) -> None:
    """Lightning with use_distributed_sampler=False (tests/work_balance_lightning.py, 2 gloo
    ranks under torchrun): each rank trains on exactly the sampler's plan (nothing re-shards
    it), the ranks' batches make up each global batch, and Lightning's set_epoch reaches the
    batch sampler (epoch 1 is the permutation of seed + 1)."""
    pytest.importorskip("pytorch_lightning")
    _torchrun("work_balance_lightning.py", tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [len(r) for r in ranks] == [6, 6]  # 3 steps per epoch, 2 epochs
    config = JobConfig(samples=16 * 3, global_batch=16)
    for epoch in (0, 1):
        reference = WorkBalancedSampler(
            len(Sequences(config)), 16, lengths=Sequences(config).lengths,
            num_replicas=2, rank=0, seed=5,
        )  # fmt: skip
        reference.set_epoch(epoch)
        list(reference)
        for index in range(3):
            steps = [r[epoch * 3 + index] for r in ranks]
            assert [s["epoch"] for s in steps] == [epoch, epoch]
            for step in steps:
                assert step["got"] == step["planned"]
                assert step["mode"] == "work"
            union = sorted(i for s in steps for i in s["got"])
            assert union == sorted(reference.step_plan(index).global_indices)
            assert steps[0]["global"] == list(reference.step_plan(index).global_indices)


@pytest.mark.usefixtures("world_of_one")
def test_in_a_group_of_one_each_sampler_reads_its_own_source() -> None:
    """A process group of one (a single-process job, or ranks simulated in one process) is
    as no group: no collective, each sampler's own reading and fit."""
    lengths = _lengths(64 * 3)
    source = _Source(shares={0: 0.1, 1: 0.3, 2: 0.3, 3: 0.3}, balance=("work", 4))
    samplers = _samplers(len(lengths), 64, lengths=lengths, mode="pacer", source=source)
    _passes(samplers)
    plans = [s.step_plan(2) for s in samplers]
    assert len({(p.sizes, p.work, p.mode, p.version) for p in plans}) == 1
    assert plans[0].mode == "work" and plans[0].version == 4
    assert plans[0].work[0] < min(plans[0].work[1:])
