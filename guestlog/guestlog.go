// Package guestlog bounds what guests can make the host log: one line per
// interval per key, and for every key together a total, whatever a VM
// sends and however often.
package guestlog

import (
	"sync"
	"time"
)

// Limit lets one log line through per Every, and counts the others.
type Limit struct {
	mu         sync.Mutex
	next       time.Time
	suppressed int
}

// Every is how often a Limit lets a line through.
const Every = 10 * time.Second

// Allow reports whether to log now and how many lines were held back since
// the last one.
func (l *Limit) Allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.next, l.suppressed = now.Add(Every), 0
	return true, n
}

// ByClient is a Limit per client key, at most MaxClients of them (then
// they start again: a bound on memory). With a Total, at most that many
// lines pass per Every over all clients together: clients that change
// their key (a port without the guard may send from any MAC) cannot grow
// the log without bound either.
type ByClient struct {
	// Total bounds the lines per Every over all keys; 0: no overall bound.
	Total int

	mu     sync.Mutex
	limits map[string]*Limit
	window time.Time // when the current Every window ends
	passed int       // lines let through in it
	held   int       // lines the total held back since one passed
}

// MaxClients bounds the clients ByClient keeps a Limit for (and a
// DHCP server a rate for).
const MaxClients = 1024

// Allow is Limit.Allow for the client key, within the total; the count
// of held-back lines includes those the total held.
func (g *ByClient) Allow(key string, now time.Time) (bool, int) {
	g.mu.Lock()
	if g.limits == nil || len(g.limits) >= MaxClients {
		g.limits = map[string]*Limit{}
	}
	l := g.limits[key]
	if l == nil {
		l = &Limit{}
		g.limits[key] = l
	}
	g.mu.Unlock()
	ok, n := l.Allow(now)
	if !ok || g.Total == 0 {
		return ok, n
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !now.Before(g.window) {
		g.window, g.passed = now.Add(Every), 0
	}
	if g.passed >= g.Total {
		g.held += 1 + n
		return false, 0
	}
	g.passed++
	n, g.held = n+g.held, 0
	return true, n
}
