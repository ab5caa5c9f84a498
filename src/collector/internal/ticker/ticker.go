// Package ticker runs a function on a fixed period in its own goroutine until stopped: the
// processor's wait_timeout releases and the connector's metric flushes.
package ticker

import "time"

// Loop is one periodic goroutine. The zero value is ready; Stop without Start is a no-op.
type Loop struct {
	stop chan struct{}
	done chan struct{}
}

// Start calls fn every interval until Stop.
func (l *Loop) Start(interval time.Duration, fn func()) {
	l.stop = make(chan struct{})
	l.done = make(chan struct{})
	go func(stop <-chan struct{}, done chan<- struct{}) {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fn()
			}
		}
	}(l.stop, l.done)
}

// Stop ends the loop and waits for a call of fn in progress to return. Idempotent.
func (l *Loop) Stop() {
	if l.stop == nil {
		return
	}
	close(l.stop)
	<-l.done
	l.stop = nil
}
