package ticker

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestLoopCallsUntilStopped(t *testing.T) {
	var calls atomic.Int64
	var l Loop
	l.Start(time.Millisecond, func() { calls.Add(1) })
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	l.Stop()
	after := calls.Load()
	if after < 3 {
		t.Fatalf("fn called %d times, want at least 3", after)
	}
	time.Sleep(20 * time.Millisecond)
	if got := calls.Load(); got != after {
		t.Fatalf("fn called %d times after Stop returned", got-after)
	}
	l.Stop() // idempotent
}

func TestStopWithoutStartIsNoop(t *testing.T) {
	var l Loop
	l.Stop()
}
