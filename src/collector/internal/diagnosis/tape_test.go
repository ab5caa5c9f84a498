package diagnosis_test

import (
	"testing"

	"github.com/skewtrace/skewtrace/src/collector/internal/diagnosis"
	"github.com/skewtrace/skewtrace/src/collector/internal/fixture"
	"github.com/skewtrace/skewtrace/src/collector/internal/join"
)

// The what-ifs replay a step along the order its first replay without settling recorded
// (the tape): every such replay of every step of the generator's pipeline layouts (with
// their faults), of the benchmark's pipeline job and of the slow-link job ends every span,
// and the step, where the replay without the tape does, to the bit, with the same breaks.
func TestReplayAlongTheTapeIsTheReplay(t *testing.T) {
	done := diagnosis.VerifyTape()
	defer done()
	for _, shape := range pipelineShapes {
		for _, c := range pipelineCases {
			if (c.name == "data-imbalance" && shape.replicas < 2) ||
				(shape.stages == 1 && (c.name == "long-stage" || c.name == "slow-link")) {
				continue
			}
			p := fixture.NewPipeline(shape.stages, shape.replicas, shape.microbatches,
				shape.chunks, 11)
			p.AsyncP2P = shape.async
			if shape.replicas == 1 {
				p.Ranks = fixture.LeafSpine(len(p.Ranks), 1, 4)
			}
			p.Input = func(int, int, int) int64 { return 1024 }
			c.set(p)
			run(t, p, join.DefaultConfig(), 12)
		}
	}
	r := newReplayer(pipelineBenchJob(nil, 64))
	r.lap()
	job := fixture.NewJob(fixture.LeafSpine(16, 2, 2), fixture.IntraCrossWorld(16, 4), 3)
	job.SlowLink = func(_ int, members []fixture.Rank) float64 {
		if onHost(members, "node3") {
			return 3
		}
		return 1
	}
	run(t, job, join.DefaultConfig(), 12)
	if n := done(); n == 0 {
		t.Fatal("no replay went along a tape")
	} else {
		t.Logf("%d replays along a tape checked", n)
	}
}
