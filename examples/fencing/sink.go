package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"

	_ "modernc.org/sqlite" // pure-Go SQLite driver, registered as "sqlite"
)

// ErrStale is returned by Sink.Write when the row holds the effect of a
// delivery whose fencing token is not smaller than the write's: the
// writer's delivery was superseded (its lease ran out and the message was
// delivered again), and its write must not land.
var ErrStale = errors.New("stale fencing token")

// Sink is a table of effects, one row per key, each stored with the
// fencing token of the delivery that wrote it. It is safe for concurrent
// use.
type Sink struct {
	db *sql.DB
}

// OpenSink opens (creating when missing) the SQLite database at path
// and its effects table.
func OpenSink(path string) (*Sink, error) {
	// Writers of other processes wait for SQLite's lock instead of
	// failing; this process's write through one connection at a time.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS effects (
		key   TEXT PRIMARY KEY,
		value TEXT NOT NULL,
		fence INTEGER NOT NULL
	)`); err != nil {
		db.Close()
		return nil, err
	}
	return &Sink{db: db}, nil
}

// Close closes the database.
func (s *Sink) Close() error { return s.db.Close() }

// Write stores value under key with the delivery's fencing token, in one
// statement: it inserts the row, or updates it only if the stored token
// is smaller. A write whose token is not greater than the stored one
// changes nothing and returns ErrStale. The check and the write are one
// statement, so no other writer can come between them.
//
// The token must be the fencing token of a delivery of the one message
// whose effect the row holds: tokens of different messages are not
// ordered with each other.
func (s *Sink) Write(ctx context.Context, key, value string, token uint64) error {
	if token == 0 || token > math.MaxInt64 {
		return fmt.Errorf("fencing token %d: not an at-least-once delivery's", token)
	}
	res, err := s.db.ExecContext(ctx, `
		INSERT INTO effects (key, value, fence) VALUES (?, ?, ?)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value, fence = excluded.fence
		WHERE excluded.fence > effects.fence`, key, value, int64(token))
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s with token %d: %w", key, token, ErrStale)
	}
	return nil
}

// Row is one stored effect.
type Row struct {
	Key, Value string
	Fence      uint64
}

// Rows returns the stored effects, by key.
func (s *Sink) Rows(ctx context.Context) ([]Row, error) {
	rs, err := s.db.QueryContext(ctx, `SELECT key, value, fence FROM effects ORDER BY key`)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []Row
	for rs.Next() {
		var r Row
		var fence int64
		if err := rs.Scan(&r.Key, &r.Value, &fence); err != nil {
			return nil, err
		}
		r.Fence = uint64(fence)
		out = append(out, r)
	}
	return out, rs.Err()
}
