package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// A minimal RESP2 encoder/decoder for the Redis side of the benchmark: enough for
// SET key tok NX PX ms, EVALSHA sha 1 key tok, SCRIPT LOAD, PING and FLUSHALL, pipelined,
// without allocating per command.

// releaseScript is the usual compare-and-delete: delete the key only if it still holds our token.
const releaseScript = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`

// appendCommand appends one RESP array of bulk strings.
func appendCommand(b []byte, args ...[]byte) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, '\r', '\n')
		b = append(b, a...)
		b = append(b, '\r', '\n')
	}
	return b
}

var (
	bSET     = []byte("SET")
	bNX      = []byte("NX")
	bPX      = []byte("PX")
	bEVALSHA = []byte("EVALSHA")
	bOne     = []byte("1")
)

// appendSetNX appends SET key tok NX PX leaseMs (leaseMs pre-formatted).
func appendSetNX(b, key, tok, leaseMs []byte) []byte {
	return appendCommand(b, bSET, key, tok, bNX, bPX, leaseMs)
}

// appendRelease appends EVALSHA sha 1 key tok.
func appendRelease(b, sha, key, tok []byte) []byte {
	return appendCommand(b, bEVALSHA, sha, bOne, key, tok)
}

// reply is one decoded RESP reply: its type byte and, for integers, the value; nil for $-1/*-1.
type reply struct {
	kind byte // '+', '-', ':', '$', '*'
	n    int64
	nil  bool
	str  []byte // simple string, error or bulk body; valid until the next read
}

var errProto = errors.New("RESP protocol error")

// readReply reads one reply. Arrays are read and their elements discarded (not used here).
func readReply(r *bufio.Reader, rp *reply) error {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return errProto
	}
	rp.kind = line[0]
	rp.nil = false
	rp.str = nil
	body := line[1 : len(line)-2]
	switch rp.kind {
	case '+', '-':
		rp.str = body
	case ':':
		rp.n, err = parseInt(body)
	case '$':
		rp.n, err = parseInt(body)
		if err != nil {
			return err
		}
		if rp.n < 0 {
			rp.nil = true
			return nil
		}
		buf, perr := r.Peek(int(rp.n) + 2)
		if perr != nil {
			// Longer than the buffer (never for our commands): skip it.
			_, err = r.Discard(int(rp.n) + 2)
			return err
		}
		rp.str = buf[:rp.n]
		_, err = r.Discard(int(rp.n) + 2)
	case '*':
		rp.n, err = parseInt(body)
		if err != nil {
			return err
		}
		if rp.n < 0 {
			rp.nil = true
			return nil
		}
		var sub reply
		for i := int64(0); i < rp.n; i++ {
			if err := readReply(r, &sub); err != nil {
				return err
			}
		}
	default:
		return errProto
	}
	return err
}

func parseInt(b []byte) (int64, error) {
	if len(b) == 0 {
		return 0, errProto
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errProto
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}

// redisConn is one connection to Redis with a buffered reader.
type redisConn struct {
	nc net.Conn
	r  *bufio.Reader
}

func dialRedis(addr string) (*redisConn, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &redisConn{nc: nc, r: bufio.NewReaderSize(nc, 64<<10)}, nil
}

// do sends one command and returns its reply as a string (errors as Go errors). Not for the hot path.
func (c *redisConn) do(args ...string) (string, error) {
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.nc.SetDeadline(time.Time{})
	if _, err := c.nc.Write(appendCommand(nil, bs...)); err != nil {
		return "", err
	}
	var rp reply
	if err := readReply(c.r, &rp); err != nil {
		return "", err
	}
	switch rp.kind {
	case '-':
		return "", fmt.Errorf("redis: %s", rp.str)
	case ':':
		return strconv.FormatInt(rp.n, 10), nil
	}
	return string(rp.str), nil
}

func (c *redisConn) Close() error { return c.nc.Close() }
