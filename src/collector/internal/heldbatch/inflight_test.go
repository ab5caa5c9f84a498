package heldbatch

import (
	"sync/atomic"
	"testing"
	"time"
)

// waitTimeout bounds how long a test waits for WaitBefore to return (a failure, not a
// measurement).
const waitTimeout = 10 * time.Second

// waitAsync runs f.WaitBefore(mark) in a goroutine; the channel closes when it returns.
func waitAsync(f *InFlight, mark uint64) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		f.WaitBefore(mark)
		close(done)
	}()
	return done
}

func mustReturn(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatalf("WaitBefore did not return %s", what)
	}
}

// WaitBefore waits for the batches that began before the mark, and not for those that began
// after it: the ticker's summary must follow the spans released before its analysis, without
// stalling behind batches that arrive meanwhile.
func TestWaitBeforeWaitsOnlyForBatchesBegunBeforeTheMark(t *testing.T) {
	var f InFlight
	first := f.Begin()
	second := f.Begin()
	mark := f.Mark()
	late := f.Begin()
	defer f.End(late)
	if mark != late {
		t.Fatalf("Mark %d, then Begin %d: the mark is the next batch's id", mark, late)
	}
	var ended atomic.Int32
	done := make(chan int32)
	go func() {
		f.WaitBefore(mark)
		done <- ended.Load()
	}()
	ended.Add(1)
	f.End(second)
	ended.Add(1)
	f.End(first)
	// late is still in flight: WaitBefore returns anyway, and only after both earlier ones
	// ended.
	select {
	case n := <-done:
		if n != 2 {
			t.Fatalf("WaitBefore returned after %d of the 2 earlier batches ended", n)
		}
	case <-time.After(waitTimeout):
		t.Fatal("WaitBefore kept waiting for a batch that began after the mark")
	}
}

func TestWaitBeforeReturnsAtOnceWithNothingEarlier(t *testing.T) {
	for name, setup := range map[string]func(f *InFlight) uint64{
		"zero value": func(f *InFlight) uint64 { return f.Mark() },
		"mark before any batch": func(f *InFlight) uint64 {
			mark := f.Mark()
			f.Begin()
			return mark
		},
		"earlier batches ended": func(f *InFlight) uint64 {
			f.End(f.Begin())
			f.End(f.Begin())
			return f.Mark()
		},
		"unknown id ended": func(f *InFlight) uint64 {
			f.End(42)
			return f.Mark()
		},
	} {
		t.Run(name, func(t *testing.T) {
			var f InFlight
			mustReturn(t, waitAsync(&f, setup(&f)), "with no earlier batch in flight")
		})
	}
}

// Several waiters with different marks each return when their own earlier batches end.
func TestWaitersWithDifferentMarks(t *testing.T) {
	var f InFlight
	a := f.Begin()
	markA := f.Mark()
	b := f.Begin()
	markB := f.Mark()
	var ended atomic.Int32
	results := make(chan [2]int32, 2)
	for _, mark := range []uint64{markA, markB} {
		go func() {
			f.WaitBefore(mark)
			results <- [2]int32{int32(mark), ended.Load()}
		}()
	}
	ended.Store(1)
	f.End(a)
	// The waiter on markA may return now; the one on markB still waits for b.
	ended.Store(2)
	f.End(b)
	for range 2 {
		select {
		case r := <-results:
			if r[0] == int32(markB) && r[1] != 2 {
				t.Errorf("the waiter on mark %d returned before batch %d ended", markB, b)
			}
			if r[1] < 1 {
				t.Errorf("the waiter on mark %d returned before batch %d ended", r[0], a)
			}
		case <-time.After(waitTimeout):
			t.Fatal("a waiter never returned")
		}
	}
}
