package heldbatch

import "sync"

// InFlight tracks the batches forwarding what they released, so that the release ticker
// can wait for those that began before it analyzed a step, and only for those: waiting
// behind a lock would stop every batch that arrives meanwhile (a 4096-rank step takes
// seconds to forward), and with them the receiver. The processor calls Begin and Mark under
// its lock, so an id orders a batch's release against the ticker's analysis. The zero value
// is ready; an InFlight must not be copied after first use.
type InFlight struct {
	mu       sync.Mutex
	cond     sync.Cond
	next     uint64
	inFlight map[uint64]struct{}
}

// Begin records a batch that starts forwarding and returns its id, for End.
func (f *InFlight) Begin() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inFlight == nil {
		f.inFlight = make(map[uint64]struct{})
	}
	id := f.next
	f.next++
	f.inFlight[id] = struct{}{}
	return id
}

// End records that the batch Begin returned id for is done forwarding.
func (f *InFlight) End(id uint64) {
	f.mu.Lock()
	delete(f.inFlight, id)
	f.mu.Unlock()
	f.cond.Broadcast()
}

// Mark returns the id the next batch will get: WaitBefore(Mark()) waits for every batch
// that began before.
func (f *InFlight) Mark() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next
}

// WaitBefore returns once no batch whose id is below mark is forwarding.
func (f *InFlight) WaitBefore(mark uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cond.L == nil {
		f.cond.L = &f.mu
	}
	for {
		earlier := false
		for id := range f.inFlight {
			if id < mark {
				earlier = true
				break
			}
		}
		if !earlier {
			return
		}
		f.cond.Wait()
	}
}
