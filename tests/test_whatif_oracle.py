"""The what-if corpus (tests/whatif/): its generator, its oracle (the reference replay) and
the named jobs. See tests/whatif/README.md for the format and the semantics."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
from collections import Counter

import pytest

import whatif.generate as generate_module
from whatif.corpus import CORPUS
from whatif.generate import (
    COLUMNS,
    EXTENSIONS,
    GENERATOR_VERSION,
    Job,
    JobSpec,
    SlowWorker,
    generate,
    schedule,
    write_csv,
    write_metadata,
    write_parquet,
)
from whatif.oracle import (
    StepAnswer,
    StepModel,
    analyze,
    analyze_step,
    build_steps,
    read_csv,
    read_metadata,
)


@functools.cache
def _job(name: str) -> Job:
    return generate(CORPUS[name])


@functools.cache
def _models(name: str) -> tuple[StepModel, ...]:
    job = _job(name)
    return tuple(build_steps(job.rows, job.metadata))


@functools.cache
def _answers(name: str) -> tuple[StepAnswer, ...]:
    return tuple(analyze_step(model) for model in _models(name))


def _verdict(answer: StepAnswer) -> tuple[dict[int, str], set[int], bool]:
    return answer.workers, set(answer.stages), answer.data


# -- the generator -------------------------------------------------------------------------


def test_generator_is_deterministic() -> None:
    spec = CORPUS["slow-worker-middle-interleaved"]
    first, second = generate(spec), generate(spec)
    assert first.rows == second.rows
    assert first.step_times == second.step_times
    assert generate(dataclasses.replace(spec, seed=spec.seed + 1)).rows != first.rows


def test_rows_metadata_and_topology() -> None:
    spec = CORPUS["slow-worker-middle-interleaved"]
    job = _job(spec.name)
    assert job.metadata == {
        "dp_size": 4,
        "pp_size": 4,
        "tp_size": 8,
        "world_size": 128,
        "num_microbatches": 8,
        "num_model_chunks": 2,
        "schedule": "interleaved-1f1b",
        "generator_version": GENERATOR_VERSION,
    }
    assert job.causes == spec.causes
    for row in job.rows:
        w = row.stage * spec.dp + row.dp_rank
        assert row.rank == w * spec.tp
        assert row.gmc == row.mc * spec.pp + row.stage
        assert (row.host, row.switch, row.nic) == (f"node{w}", f"leaf{w // 4}", "eth0")
        assert row.duration >= 0
        assert row.start_ts > 1_796_083_200_000_000  # 2026-12-01 in epoch microseconds
    per_step = Counter(row.step for row in job.rows)
    assert sorted(per_step) == list(range(spec.steps))
    assert len(set(per_step.values())) == 1
    # Each worker: one forward and one backward per (chunk, microbatch) per step; the DP
    # collectives once per chunk; the dataloader on stage 0 once per microbatch.
    worker_step = [r for r in job.rows if r.step == 3 and r.stage == 0 and r.dp_rank == 1]
    kinds = Counter(r.optype for r in worker_step)
    assert kinds["forward-compute"] == kinds["backward-compute"] == 16
    assert kinds["grads-reduce-scatter"] == kinds["params-all-gather"] == 2
    assert kinds["embedding-grads-all-reduce"] == 1
    assert kinds["dataloader"] == 8
    seqs = [r.seq_id for r in worker_step if r.optype == "forward-compute"]
    assert seqs == list(range(16))


@pytest.mark.parametrize(
    ("pp", "microbatches", "chunks"),
    [(2, 2, 1), (4, 8, 1), (4, 2, 1), (4, 4, 2), (4, 8, 2), (8, 16, 3)],
)
def test_schedule_runs_every_microbatch_once(pp: int, microbatches: int, chunks: int) -> None:
    for stage in range(pp):
        actions = schedule(pp, stage, microbatches, chunks)
        forwards = [(a[1], a[2]) for a in actions if a[0] == "F"]
        backwards = [(a[1], a[2]) for a in actions if a[0] == "B"]
        every = {(c, b) for c in range(chunks) for b in range(microbatches)}
        assert sorted(forwards) == sorted(every) and sorted(backwards) == sorted(every)
        for key in every:
            assert actions.index(("F", *key)) < actions.index(("B", *key))
        if chunks == 1:
            # 1F1B: the warmup forwards before the first backward.
            first_backward = actions.index(next(a for a in actions if a[0] == "B"))
            ahead = sum(1 for a in actions[:first_backward] if a[0] == "F")
            assert ahead == min(pp - stage, microbatches)


def test_deadlock_is_detected() -> None:
    """Two workers that each wait in a rendezvous recv for a send the other posts later."""
    spec = JobSpec("deadlock", dp=1, pp=2)
    builder = generate_module._Builder(spec, random.Random(0))
    programs = []
    for stage, peer in ((0, 1), (1, 0)):
        recv = generate_module._Op("x-recv", 0, 0, "recv", key=("to", stage))
        send = generate_module._Op("x-send", 0, 0, "send", key=("to", peer))
        builder.transfers[("to", peer)] = 1e-3
        programs.append(
            [generate_module._Unit(0, 1e-4, [recv]), generate_module._Unit(0, 1e-4, [send])]
        )
    with pytest.raises(generate_module.Deadlock):
        generate_module._simulate(programs, builder, eager=False)
    # With eager sends it still deadlocks: each recv comes before its worker's send.
    with pytest.raises(generate_module.Deadlock):
        generate_module._simulate(programs, builder, eager=True)


def test_files(tmp_path) -> None:
    job = _job("slow-dataloader")
    write_csv(job, tmp_path / "job.csv")
    write_metadata(job, tmp_path / "job.json")
    header = (tmp_path / "job.csv").read_text().splitlines()[0]
    assert header.split(",") == list(COLUMNS + EXTENSIONS)
    rows, metadata = read_csv(tmp_path / "job.csv"), read_metadata(tmp_path / "job.json")
    assert metadata == job.metadata
    assert len(rows) == len(job.rows)
    assert analyze(rows, metadata) == list(_answers("slow-dataloader"))


def test_parquet(tmp_path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    job = _job("slow-dataloader")
    write_parquet(job, tmp_path / "job.parquet")
    table = pq.read_table(tmp_path / "job.parquet")
    assert table.column_names == list(COLUMNS + EXTENSIONS)
    assert table.num_rows == len(job.rows)


# -- the oracle ----------------------------------------------------------------------------


@pytest.mark.slow  # every corpus job generated and replayed: make test, not test-fast
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_self_test_on_every_corpus_job(name: str) -> None:
    """The replay of the recorded values ends every unit where it was recorded, and the step
    times are the simulated ones (rounded to microseconds per start and end)."""
    job = _job(name)
    models = _models(name)
    assert [m.step for m in models] == list(range(CORPUS[name].steps))
    for model in models:
        actual = model.self_test()
        assert actual == pytest.approx(job.step_times[model.step], abs=1e-5)


def test_self_test_catches_a_wrong_row() -> None:
    job = _job("healthy-1f1b")
    rows = list(job.rows)
    i = next(i for i, r in enumerate(rows) if r.step == 2 and r.optype == "grads-reduce-scatter")
    rows[i] = rows[i]._replace(duration=rows[i].duration + 1000)
    models = build_steps(rows, job.metadata)
    with pytest.raises(AssertionError, match="step 2"):
        models[2].self_test()


# Round numbers in microseconds, no jitter: forward F, backward B, dataloader D, p2p T, gap g.
F, B, D, T, G = 1000, 2000, 100, 100, 10
RS, AG, EMB, LN, CLIP, OPT = 500, 400, 200, 50, 100, 300


def _tiny(*causes: SlowWorker) -> JobSpec:
    return JobSpec(
        "tiny",
        dp=2,
        pp=2,
        microbatches=2,
        steps=3,
        seed=0,
        jitter=0.0,
        gap_jitter=0.0,
        forward=F * 1e-6,
        backward=B * 1e-6,
        dataloader=D * 1e-6,
        p2p_transfer=T * 1e-6,
        host_gap=G * 1e-6,
        reduce_scatter=RS * 1e-6,
        all_gather=AG * 1e-6,
        embedding_all_reduce=EMB * 1e-6,
        layernorm_all_reduce=LN * 1e-6,
        clip_grad=CLIP * 1e-6,
        optimizer=OPT * 1e-6,
        causes=causes,
    )


def _tiny_step_us(f1: int, b1: int) -> int:
    """One step of the tiny job (pp=2, 2 microbatches), stage 1 of one replica computing
    f1 / b1 per forward / backward (the other replica is not slower), traced by hand:

    stage 0: dl0 F0 send(f0) | dl1 F1 [send f1, recv b0] B0 recv(b1) B1 | rs emb ln clip opt ag
    stage 1: recv(f0) | F0 B0 [send b0, recv f1] F1 B1 send(b1) | rs emb ln clip opt ag

    send(f0) is issued at a = 3g + D + F and ends at a + T; the batches [f1, b0] end together
    at c = a + T + 3g + f1 + b1 + T (stage 1's issue is the later); b1 ends at
    d = c + 3g + f1 + b1 + T; then stage 0's B1, the reduce-scatter (stage 0 the later), the
    embedding all-reduce over both stages, layernorm, clip, optimizer, the all-gather.
    """
    a = 3 * G + D + F
    c = a + T + 3 * G + f1 + b1 + T
    d = c + 3 * G + f1 + b1 + T
    e = d + 3 * G + B + RS + EMB
    return e + 4 * G + LN + CLIP + OPT + AG


def test_tiny_job_by_hand() -> None:
    healthy = _tiny_step_us(F, B)
    slow = _tiny_step_us(2 * F, 2 * B)
    assert healthy == 16 * G + D + 3 * F + 3 * B + 3 * T + RS + EMB + LN + CLIP + OPT + AG
    assert healthy == 11_110 and slow == 17_110

    job = generate(_tiny())
    for answer in analyze(job.rows, job.metadata):
        # The first step starts at each worker's first issue: one gap less.
        expected = (healthy - (G if answer.step == 0 else 0)) * 1e-6
        assert answer.actual == pytest.approx(expected, abs=1e-9)
        assert answer.ideal == pytest.approx(expected, abs=1e-9)
        assert _verdict(answer) == ({}, set(), False)

    # Worker 3 (stage 1, replica 1) computes twice as long: the medians stay F and B.
    job = generate(_tiny(SlowWorker(stage=1, dp_rank=1, factor=2.0)))
    for answer in analyze(job.rows, job.metadata):
        first = G if answer.step == 0 else 0
        assert answer.actual == pytest.approx((slow - first) * 1e-6, abs=1e-9)
        assert answer.ideal == pytest.approx((healthy - first) * 1e-6, abs=1e-9)
        assert answer.slowdown == pytest.approx((slow - first) / (healthy - first))
        assert answer.savings["worker:3"] == pytest.approx((slow - healthy) * 1e-6, abs=1e-9)
        assert answer.savings["stage:1"] == pytest.approx((slow - healthy) * 1e-6, abs=1e-9)
        # Data balance puts stage 1 at its own medians, 1.5 F and 1.5 B.
        data = slow - _tiny_step_us(3 * F // 2, 3 * B // 2)
        assert answer.savings["data"] == pytest.approx(data * 1e-6, abs=1e-9)
        assert _verdict(answer) == ({3: "compute"}, set(), False)


def test_healthy_names_nothing() -> None:
    for name in ("healthy-1f1b", "healthy-interleaved-eager"):
        for answer in _answers(name):
            assert 0.95 < answer.slowdown < 1.05, (name, answer.step, answer.slowdown)
            assert _verdict(answer) == ({}, set(), False), (name, answer.step)


def test_slow_worker() -> None:
    for answer in _answers("slow-worker-stage0"):
        assert _verdict(answer) == ({2: "compute"}, set(), False)
        assert answer.slowdown > 1.1


def test_heavy_stage() -> None:
    for name, stage in (("heavy-last-stage", 3), ("heavy-stage-2stage", 1)):
        for answer in _answers(name):
            assert _verdict(answer) == ({}, {stage}, False), (name, answer.step)


def test_sequence_imbalance() -> None:
    answers = _answers("sequence-imbalance")
    for answer in answers:
        assert _verdict(answer) == ({}, set(), True), answer.step
    slowest = []
    for answer in answers:
        replicas = {k: v for k, v in answer.savings.items() if k.startswith("replica:")}
        slowest.append(max(replicas, key=lambda k: replicas[k]))
    changes = sum(1 for a, b in itertools.pairwise(slowest) if a != b)
    assert changes >= (len(slowest) - 1) * 2 // 3, slowest


def test_heavy_stage_and_sequence_imbalance() -> None:
    for answer in _answers("heavy-stage-sequence-imbalance"):
        assert _verdict(answer) == ({}, {1}, True), answer.step


def test_slow_link() -> None:
    for name, worker in (("slow-link", 2), ("slow-link-interleaved-eager", 11)):
        for answer in _answers(name):
            assert _verdict(answer) == ({worker: "network"}, set(), False), (name, answer.step)


def test_slow_dataloader() -> None:
    for answer in _answers("slow-dataloader"):
        assert _verdict(answer) == ({1: "data"}, set(), False)


def test_host_work() -> None:
    for answer in _answers("host-work"):
        assert _verdict(answer) == ({11: "host_work"}, set(), False)


def test_fault_from_the_middle() -> None:
    for answer in _answers("late-slow-worker"):
        expected = ({4: "compute"}, set(), False) if answer.step >= 6 else ({}, set(), False)
        assert _verdict(answer) == expected, answer.step


# What the oracle names in every step of every corpus job (corpus.py's comments).
EXPECTED = {
    "healthy-1f1b": lambda step: ({}, set(), False),
    "healthy-interleaved-eager": lambda step: ({}, set(), False),
    "slow-worker-stage0": lambda step: ({2: "compute"}, set(), False),
    "slow-worker-middle-interleaved": lambda step: ({9: "compute"}, set(), False),
    "heavy-last-stage": lambda step: ({}, {3}, False),
    "heavy-stage-2stage": lambda step: ({}, {1}, False),
    "sequence-imbalance": lambda step: ({}, set(), True),
    "heavy-stage-sequence-imbalance": lambda step: ({}, {1}, True),
    "slow-link": lambda step: ({2: "network"}, set(), False),
    "slow-link-interleaved-eager": lambda step: ({11: "network"}, set(), False),
    "slow-dataloader": lambda step: ({1: "data"}, set(), False),
    "host-work": lambda step: ({11: "host_work"}, set(), False),
    "late-slow-worker": lambda step: ({4: "compute"} if step >= 6 else {}, set(), False),
    "wide-256-slow-worker": lambda step: ({232: "compute"}, set(), False),
    "many-microbatches-slow-worker": lambda step: ({3: "compute"}, set(), False),
    "deep-slow-worker-then-link": lambda step: (
        {4: "compute"} if step < 4 else {13: "network"},
        set(),
        False,
    ),
    "tokens-dp4-pp4": lambda step: ({}, set(), True),
    "tokens-dp8-pp4": lambda step: ({}, set(), True),
    "layers-heavy-last": lambda step: ({}, {3}, False),
    "layers-heavy-2stage": lambda step: ({}, {1}, False),
}


def test_expectations_cover_the_corpus() -> None:
    assert set(EXPECTED) == set(CORPUS)


@pytest.mark.slow  # every corpus job generated and replayed: make test, not test-fast
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_verdicts(name: str) -> None:
    for answer in _answers(name):
        assert _verdict(answer) == EXPECTED[name](answer.step), (name, answer.step)


def test_the_recordings_the_go_tests_read_are_of_this_generator_and_oracle() -> None:
    """tests/data/recorded/whatif (tests/whatif/record.py) holds what the generator and the
    oracle give now: the same generator version everywhere, and the same answers as a fresh
    run for the smallest job (re-record after changing either)."""
    import json

    from whatif.generate import GENERATOR_VERSION
    from whatif.record import OUT, RECORDED

    for name in RECORDED:
        document = json.loads((OUT / f"{name}.oracle.json").read_text())
        assert document["generator_version"] == GENERATOR_VERSION, name
        assert (OUT / f"{name}.jsonl.gz").stat().st_size > 0
    document = json.loads((OUT / "slow-dataloader.oracle.json").read_text())
    fresh = _answers("slow-dataloader")
    assert [s["step"] for s in document["steps"]] == [a.step for a in fresh]
    for recorded, answer in zip(document["steps"], fresh, strict=True):
        assert recorded["workers"] == {str(w): c for w, c in answer.workers.items()}
        assert recorded["stages"] == sorted(answer.stages)
        assert recorded["data"] == answer.data
        assert recorded["slowdown"] == pytest.approx(answer.slowdown, rel=1e-9)
