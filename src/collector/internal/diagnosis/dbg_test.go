package diagnosis_test

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/skewtrace/skewtrace/src/collector/internal/join"
	"github.com/skewtrace/skewtrace/src/collector/internal/semconv"
)

func TestDbgFile(t *testing.T) {
	path, job := os.Getenv("DBG_FILE"), os.Getenv("DBG_JOB")
	if path == "" {
		t.Skip()
	}
	f, _ := os.Open(path)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<26), 1<<26)
	var u ptrace.JSONUnmarshaler
	cfg := join.DefaultConfig()
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	e := join.New[int](cfg, clock)
	for sc.Scan() {
		td, err := u.UnmarshalTraces(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		td.ResourceSpans().RemoveIf(func(rs ptrace.ResourceSpans) bool {
			v, _ := rs.Resource().Attributes().Get(semconv.AttrJobID)
			_, rank := rs.Resource().Attributes().Get(semconv.AttrRank)
			return v.Str() != job || !rank
		})
		feed(t, e, td)
		clock.now = clock.now.Add(10 * time.Millisecond)
	}
	clock.now = clock.now.Add(time.Minute)
	rs := e.Analyze(true)
	sort.Slice(rs, func(i, j int) bool { return rs[i].Step < rs[j].Step })
	for _, r := range rs {
		fmt.Printf("step %d dur %.4f whatif %.4f err %.3f ranks %d colls %d roots %v\n", r.Step, r.Duration, r.WhatIf, r.ReplayError, r.Ranks, r.Collectives, r.RootCauses)
	}
}
