package spanio

import (
	"crypto/sha256"
	"testing"
)

// TestDerivedIDsAreTheDocumentedSHA256Prefixes pins every derived ID to its key as
// docs/semantic-conventions.md and src/skewtrace/_ids.py write it: a rank, a summary and the
// traceshape processor must agree on them without talking.
func TestDerivedIDsAreTheDocumentedSHA256Prefixes(t *testing.T) {
	prefix := func(key string, n int) []byte {
		sum := sha256.Sum256([]byte(key))
		return sum[:n]
	}
	cases := []struct {
		name string
		got  []byte
		key  string
		n    int
	}{
		{"StepTraceID", func() []byte { id := StepTraceID("job-7", 12); return id[:] }(), "skewtrace/trace/job-7/12", 16},
		{"StepRootSpanID", func() []byte { id := StepRootSpanID("job-7", 12); return id[:] }(), "skewtrace/root/job-7/12", 8},
		{"StepSummarySpanID", func() []byte { id := StepSummarySpanID("job-7", 12); return id[:] }(), "skewtrace/summary/job-7/12", 8},
		{"RankStepSpanID", func() []byte { id := RankStepSpanID("job-7", 12, 3); return id[:] }(), "skewtrace/rankstep/job-7/12/3", 8},
		{"RankStepTraceID", func() []byte { id := RankStepTraceID("job-7", 12, 3); return id[:] }(), "skewtrace/ranktrace/job-7/12/3", 16},
	}
	for _, c := range cases {
		if string(c.got) != string(prefix(c.key, c.n)) {
			t.Errorf("%s = %x, want the first %d bytes of sha256(%q)", c.name, c.got, c.n, c.key)
		}
	}
}
