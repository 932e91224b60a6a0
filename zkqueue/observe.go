package zkqueue

import (
	"time"

	"github.com/go-zookeeper/zk"
)

// Observer receives the latency and outcome of every ZooKeeper request a
// Queue makes (op is "get", "create", "delete", "multi", "children",
// "exists" or "set"), for metrics. A Committer also reports each
// transaction given to Do as op "commit": from Do's call to its answer,
// the wait for a batch and a session included.
type Observer func(op string, d time.Duration, err error)

// observed wraps a connection, reporting each request to an Observer.
type observed struct {
	conn *zk.Conn
	obs  Observer
}

func (o observed) done(op string, start time.Time, err error) {
	if o.obs != nil {
		o.obs(op, time.Since(start), err)
	}
}

func (o observed) Get(p string) ([]byte, *zk.Stat, error) {
	start := time.Now()
	data, stat, err := o.conn.Get(p)
	o.done("get", start, err)
	return data, stat, err
}

func (o observed) GetW(p string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	start := time.Now()
	data, stat, w, err := o.conn.GetW(p)
	o.done("get", start, err)
	return data, stat, w, err
}

func (o observed) Create(p string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	start := time.Now()
	s, err := o.conn.Create(p, data, flags, acl)
	o.done("create", start, err)
	return s, err
}

func (o observed) Delete(p string, version int32) error {
	start := time.Now()
	err := o.conn.Delete(p, version)
	o.done("delete", start, err)
	return err
}

func (o observed) Set(p string, data []byte, version int32) (*zk.Stat, error) {
	start := time.Now()
	stat, err := o.conn.Set(p, data, version)
	o.done("set", start, err)
	return stat, err
}

func (o observed) Multi(ops ...any) ([]zk.MultiResponse, error) {
	start := time.Now()
	res, err := o.conn.Multi(ops...)
	o.done("multi", start, err)
	return res, err
}

func (o observed) Children(p string) ([]string, *zk.Stat, error) {
	start := time.Now()
	c, stat, err := o.conn.Children(p)
	o.done("children", start, err)
	return c, stat, err
}

func (o observed) ChildrenW(p string) ([]string, *zk.Stat, <-chan zk.Event, error) {
	start := time.Now()
	c, stat, w, err := o.conn.ChildrenW(p)
	o.done("children", start, err)
	return c, stat, w, err
}

func (o observed) Exists(p string) (bool, *zk.Stat, error) {
	start := time.Now()
	ok, stat, err := o.conn.Exists(p)
	o.done("exists", start, err)
	return ok, stat, err
}
