"""The corpus's imbalance jobs with a remedy: the verdict names the right imbalance, and the
remedy, applied by generating the job again, realizes a saving near what the verdict predicts
(issue 46; benchmarks/remedies.py prints the table, docs/evaluation.md "Remedies: predicted
against realized").

Each job (tests/whatif/corpus.py: ``tokens-*`` with real token lengths, ``layers-*`` with a loss
head) is played through the built Collector as tests/test_whatif_corpus.py plays the corpus,
and generated again with the product's remedy (split_by_work; advise_partition). Per step: the
verdict's ``training.imbalance.cost`` and, for a stage, its fix's repartition share; the
realized saving is the generator's step before minus after.

The tolerances, from what the verdicts price and what the remedies can move:

- data: the verdict prices each micro-batch at its class mean, the work split finely; the
  remedy moves whole samples, and a long sample (up to 8192 tokens, 64x the median's work)
  stays whole. So the realized saving is below the predicted one, by more where the parts are
  many and small: 0.85 of it at 4 replicas x 4 stages, 0.59 at 8 x 4 (256 and 512 samples,
  8 a micro-batch). Asserted: between 0.4 and 1.1 of the prediction.
- stage: the repartition figure moves the heavy stage's excess evenly to the others (every
  stage at the mean, 4.4 at 4 stages and 4.8 at 2); whole layers reach a slowest stage of
  5.0, and the advice (advise_partition) takes, among the partitions that reach it, the one
  whose 1F1B step replays shortest: under 1F1B a stage's place matters too, so the share to
  expect is not the slowest stage's (5.6 - 5.0) / (5.6 - mean) but the replayed one,
  (replay now - replay advised) / (replay now - replay at the mean), from replay_1f1b of the
  stages' costs at the job's micro-batches (the generator at compute only is replay_1f1b's
  step, tests/test_remedies_sim.py): 0.79 for layers-heavy-last (now (5, 4, 4, 4), 0.50 by
  the slowest stage alone under the old most-even advice) and 0.82 for layers-heavy-2stage;
  observed 0.79 and 0.79. Asserted: within the fix's rounding (it quotes whole percents N of
  the step: up to 0.5 / N of the figure, N = 11 and 8 here) plus 0.05 for what a replay of the
  compute leaves out (point-to-point transfers, host gaps, jitter and the data-parallel
  collectives stay where they are).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skewtrace.remedy.partition import replay_1f1b, stage_costs
from whatif.corpus import CORPUS
from whatif.generate import Layers, with_remedy
from whatif.remedies import Compared, compare_corpus, remedy_of

pytestmark = [pytest.mark.collector, pytest.mark.slow]

REMEDY_JOBS = [name for name, spec in CORPUS.items() if remedy_of(spec)]


@pytest.fixture(scope="module")
def compared(otelcol_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Compared]:
    rows = compare_corpus(REMEDY_JOBS, otelcol_path, tmp_path_factory.mktemp("remedies"))
    return {row.name: row for row in rows}


def test_the_corpus_has_remedy_jobs_of_both_kinds() -> None:
    kinds = {remedy_of(CORPUS[name]) for name in REMEDY_JOBS}
    assert kinds == {"split_by_work", "advise_partition"}
    assert len(REMEDY_JOBS) >= 4


@pytest.mark.parametrize("name", REMEDY_JOBS)
def test_the_verdict_names_the_imbalance_in_every_step(
    compared: dict[str, Compared], name: str
) -> None:
    row = compared[name]
    expected = "data_imbalance" if remedy_of(row.spec) == "split_by_work" else "stage_imbalance"
    assert row.cause == expected
    assert row.named_steps == row.steps == row.spec.steps
    assert row.wrong_steps == 0


@pytest.mark.parametrize("name", REMEDY_JOBS)
def test_the_remedy_realizes_a_saving_in_every_step(
    compared: dict[str, Compared], name: str
) -> None:
    row = compared[name]
    assert row.realized_s is not None and row.realized_s > 0
    assert row.realized_positive == row.steps


@pytest.mark.parametrize("name", REMEDY_JOBS)
def test_the_realized_saving_is_near_the_predicted_one(
    compared: dict[str, Compared], name: str
) -> None:
    row = compared[name]
    assert row.realized_s is not None
    if row.cause == "data_imbalance":
        ratio = row.realized_s / row.predicted_s
        assert 0.4 <= ratio <= 1.1, ratio
        return
    assert row.repartition_s is not None
    # the verdict's cost (the stage as fast as the others) is more than its repartition
    assert row.predicted_s > row.repartition_s
    (layers,) = (c for c in row.spec.causes if isinstance(c, Layers))
    (advised,) = (c for c in with_remedy(row.spec).causes if isinstance(c, Layers))
    pp, microbatches = row.spec.pp, row.spec.microbatches

    def replayed(stages: tuple[float, ...]) -> float:
        return replay_1f1b(list(stages), [2 * c for c in stages], microbatches)

    now = replayed(stage_costs(layers.costs, layers.partition))
    after = replayed(stage_costs(layers.costs, advised.partition))
    even = replayed((sum(layers.costs) / pp,) * pp)
    expected = (now - after) / (now - even)
    quoted = round(row.repartition_s / row.step_s * 100)  # the fix's whole percent
    ratio = row.realized_s / row.repartition_s
    assert abs(ratio - expected) <= expected * 0.5 / quoted + 0.05, (ratio, expected, quoted)
