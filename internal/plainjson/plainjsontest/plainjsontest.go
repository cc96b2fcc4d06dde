// Package plainjsontest helps the differential tests of the broker's
// reflection-free JSON fast paths (requeststate, mcpapi's request parser,
// vault's grant records) build their random corpora.
package plainjsontest

import "math/rand/v2"

// Mutate returns a copy of b with one to three random edits: a byte
// replaced by one from alphabet (pick characters the parser under test
// decides on), a byte removed, a byte of b duplicated elsewhere, or the
// tail cut.
func Mutate(rng *rand.Rand, b []byte, alphabet string) []byte {
	b = append([]byte(nil), b...)
	for range 1 + rng.IntN(3) {
		if len(b) == 0 {
			break
		}
		i := rng.IntN(len(b))
		switch rng.IntN(4) {
		case 0:
			b[i] = alphabet[rng.IntN(len(alphabet))]
		case 1:
			b = append(b[:i], b[i+1:]...)
		case 2:
			b = append(b[:i], append([]byte{b[rng.IntN(len(b))]}, b[i:]...)...)
		default:
			b = b[:i]
		}
	}
	return b
}
