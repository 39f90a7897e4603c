package keylane

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

// ids makes UUIDv7 ids (RFC 9562) as keylane's kl_event_make_id(): 48-bit
// Unix ms, version 7, a 12-bit counter seeded with 11 random bits (so ids
// made in one process only grow, also across goroutines and a clock that
// steps back; past 2048+ ids in a ms it borrows the next ms, as the RFC
// allows), variant 10, 62 random bits.
var ids struct {
	mu   sync.Mutex
	last uint64
	pool [10 * 400]byte
	used int
}

// NewID returns a new time-ordered idempotency id (UUIDv7 text, 36 bytes).
func NewID() string { return newIDAt(time.Now().UnixMilli()) }

func newIDAt(nowMS int64) string {
	var rnd [10]byte
	ids.mu.Lock()
	if ids.used == 0 || ids.used >= len(ids.pool) {
		if _, err := rand.Read(ids.pool[:]); err != nil {
			panic("keylane: no randomness for ids: " + err.Error())
		}
		ids.used = 0
	}
	copy(rnd[:], ids.pool[ids.used:])
	ids.used += 10
	stamp := uint64(nowMS)<<12 | uint64(rnd[0]&0x07)<<8 | uint64(rnd[1])
	if stamp <= ids.last {
		stamp = ids.last + 1
	}
	ids.last = stamp
	ids.mu.Unlock()
	var b [16]byte
	for i := 0; i < 6; i++ {
		b[i] = byte(stamp >> (52 - 8*uint(i)))
	}
	b[6] = 0x70 | byte(stamp>>8)&0x0f
	b[7] = byte(stamp)
	b[8] = 0x80 | rnd[2]&0x3f
	copy(b[9:], rnd[3:10])
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	hex.Encode(s[9:13], b[4:6])
	hex.Encode(s[14:18], b[6:8])
	hex.Encode(s[19:23], b[8:10])
	hex.Encode(s[24:36], b[10:16])
	s[8], s[13], s[18], s[23] = '-', '-', '-', '-'
	return string(s[:])
}
