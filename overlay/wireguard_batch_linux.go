package overlay

import (
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"
)

// wgBatch is how many packets wireguard-go takes per read of the TUN and
// of each UDP socket. Its own choice, 128 (conn.IdealBatchSize), gives
// each of those three loops 128 buffers of 64 KiB (its largest message):
// 27 MB of heap per idle device, which also doubles the GC's goal. With
// the batch below, the loops hold wgBatch of its buffers each, and the
// readers underneath (which still read up to 128 packets at once: the
// UDP socket's batch and a TUN's segmented TCP are that large) get small
// buffers for the rest, the size of a packet of the segment (smallBatch).
// docs/multihost.md#wireguard has the measurements.
const wgBatch = 16

// smallBatch hands its reader's packets out wgBatch at a time. The
// reader reads into bufs: the caller's wgBatch buffers first, then the
// small ones of spare, which hold the packets after those until the
// next calls take them (copied into the caller's buffers).
type smallBatch struct {
	bufs  [][]byte // the reader's: len is its batch
	spare [][]byte // bufs[wgBatch:]'s own buffers
	sizes []int
	eps   []conn.Endpoint // for a bind's reader
	next  int             // the first packet the caller has not had
	n     int             // the reader's last count
}

// newSmallBatch is a smallBatch for a reader of batch packets; big of
// its last buffers are the largest message (a UDP reader with GRO reads
// coalesced packets there before it splits them), the others size bytes.
func newSmallBatch(batch, big, size int) *smallBatch {
	b := &smallBatch{bufs: make([][]byte, batch), sizes: make([]int, batch), eps: make([]conn.Endpoint, batch)}
	b.spare = make([][]byte, batch)
	for i := wgBatch; i < batch; i++ {
		if i >= batch-big {
			size = 65536
		}
		b.spare[i] = make([]byte, size)
	}
	return b
}

// read fills the caller's bufs (of which there are at most wgBatch) from
// what the reader read last, or has read reads again. offset is where
// packets start in a buffer.
func (b *smallBatch) read(bufs [][]byte, sizes []int, eps []conn.Endpoint, offset int, read func([][]byte, []int, []conn.Endpoint) (int, error)) (int, error) {
	if b.next >= b.n {
		for i := range b.bufs {
			if i < len(bufs) {
				b.bufs[i] = bufs[i]
			} else {
				b.bufs[i] = b.spare[i]
			}
		}
		// With an error, a count too: a TUN's segments before the ones
		// that did not fit (tun.ErrTooManySegments), which wireguard-go
		// sends before it looks at the error. The caller gets at most its
		// buffers' worth.
		n, err := read(b.bufs, b.sizes, b.eps)
		n = max(n, 0)
		k := min(n, len(bufs)) // already in the caller's buffers
		copy(sizes, b.sizes[:k])
		if eps != nil {
			copy(eps, b.eps[:k])
		}
		b.next, b.n = k, n
		return k, err
	}
	k := 0
	for ; k < len(bufs) && b.next < b.n; k, b.next = k+1, b.next+1 {
		sizes[k] = copy(bufs[k][offset:], b.bufs[b.next][offset:offset+b.sizes[b.next]])
		if eps != nil {
			eps[k] = b.eps[b.next]
		}
	}
	return k, nil
}

// smallBatchBind is a conn.Bind whose batch is wgBatch.
type smallBatchBind struct {
	conn.Bind
	size int // the largest datagram of the segment
}

func (s *smallBatchBind) BatchSize() int { return wgBatch }

func (s *smallBatchBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	fns, port, err := s.Bind.Open(port)
	batch := s.Bind.BatchSize()
	if err != nil || batch <= wgBatch {
		return fns, port, err
	}
	for i, fn := range fns {
		// conn's GRO reads coalesced datagrams into its last 2 buffers
		// (IdealBatchSize / udpSegmentMaxDatagrams).
		b := newSmallBatch(batch, 2, s.size)
		fns[i] = func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
			return b.read(bufs, sizes, eps, 0, fn)
		}
	}
	return fns, port, nil
}

// smallBatchTUN is a TUN whose batch is wgBatch.
type smallBatchTUN struct {
	tun.Device
	b      *smallBatch
	offset int
}

// newSmallBatchTUN is t with batches of wgBatch, for packets of up to mtu
// bytes after offset (wireguard-go's room for its header, which it
// passes to Read).
func newSmallBatchTUN(t tun.Device, mtu, offset int) tun.Device {
	if t.BatchSize() <= wgBatch {
		return t
	}
	return &smallBatchTUN{Device: t, b: newSmallBatch(t.BatchSize(), 0, offset+mtu), offset: offset}
}

func (s *smallBatchTUN) BatchSize() int { return wgBatch }

func (s *smallBatchTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	return s.b.read(bufs, sizes, nil, offset, func(bufs [][]byte, sizes []int, _ []conn.Endpoint) (int, error) {
		return s.Device.Read(bufs, sizes, offset)
	})
}
