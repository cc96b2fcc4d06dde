package egress

import (
	"fmt"
	"io"
)

// ReadAll reads r to the end, refusing more than limit bytes: the answer
// is an error wrapping ErrTooLarge once limit+1 bytes were seen (the rest
// is not read).
func ReadAll(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, tooLarge(limit)
	}
	return b, nil
}

// CapBody returns rc limited to limit bytes: reading past the limit gives
// the bytes up to it and then an error wrapping ErrTooLarge, never more.
// Closing closes rc.
func CapBody(rc io.ReadCloser, limit int64) io.ReadCloser {
	return &cappedBody{rc: rc, limit: limit, left: limit}
}

func tooLarge(limit int64) error {
	return fmt.Errorf("%w (%d bytes)", ErrTooLarge, limit)
}

type cappedBody struct {
	rc          io.ReadCloser
	limit, left int64
	err         error // sticky: once over, always over
}

func (c *cappedBody) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	// Ask for one byte more than is left, to see whether there is more.
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.rc.Read(p)
	if int64(n) > c.left {
		n = int(c.left)
		c.left = 0
		c.err = tooLarge(c.limit)
		return n, c.err
	}
	c.left -= int64(n)
	return n, err
}

func (c *cappedBody) Close() error { return c.rc.Close() }
