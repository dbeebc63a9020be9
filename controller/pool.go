package controller

import (
	"runtime"
	"sync"
)

// parallel runs fn(i) for i in [0, n), at most limit at a time, in order
// (the first start first, so the head of a long plan is never starved by
// its tail), and returns once every call has returned. Its goroutines are
// at most limit, whatever n is: 10,000 attachments cost no more threads
// or stacks than 10.
func parallel(n, limit int, fn func(i int)) {
	limit = max(1, min(limit, n))
	next := make(chan int)
	var wg sync.WaitGroup
	for range limit {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// launchWorkers is how many helpers start at once. Starting one is mostly
// CPU (a process, and the nftables and netlink work of its port), so a few
// per CPU keep the machine busy; more only make every start slower, each
// past its neighbours' work, until none is ready in time.
func launchWorkers() int { return min(32, 4*runtime.NumCPU()) }

// stopWorkers is how many helpers stop at once: a stop is mostly waiting
// for the process to exit.
const stopWorkers = 64
