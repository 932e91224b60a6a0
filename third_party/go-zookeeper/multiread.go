package zk

import "reflect"

// opMultiRead is ZooKeeper's multiRead (3.6 and later): several reads in
// one request, each answered on its own.
const opMultiRead = 22

// ReadResponse is the answer to one read of MultiGet. It is an alias of
// an unnamed struct type, not a type of its own, so that code built
// against the released go-zookeeper, which has no ReadResponse, can still
// spell MultiGet's signature with the types that release has, and find the
// method with a type assertion where this client is in use.
type ReadResponse = struct {
	Data  []byte
	Stat  *Stat
	Error error
}

type multiReadResponse struct {
	Ops []ReadResponse
}

func (r *multiReadResponse) Decode(buf []byte) (int, error) {
	total := 0
	for {
		header := &multiHeader{}
		n, err := decodePacketValue(buf[total:], reflect.ValueOf(header))
		if err != nil {
			return total, err
		}
		total += n
		if header.Done {
			return total, nil
		}
		var res ReadResponse
		switch header.Type {
		case opError:
			var code ErrCode
			n, err = decodePacketValue(buf[total:], reflect.ValueOf(&code))
			res.Error = code.toError()
		case opGetData:
			d := &getDataResponse{}
			n, err = decodePacketValue(buf[total:], reflect.ValueOf(d))
			res.Data, res.Stat = d.Data, &d.Stat
		default:
			return total, ErrAPIError
		}
		if err != nil {
			return total, err
		}
		total += n
		r.Ops = append(r.Ops, res)
	}
}

// MultiGet reads the data of every path in one request (ZooKeeper's
// multiRead, 3.6 and later): one round trip and one pass through the
// server's request pipeline for all of them. Each read succeeds or fails
// on its own (a missing node is ErrNoNode in its ReadResponse); the
// reads are not a snapshot of one instant.
func (c *Conn) MultiGet(paths ...string) ([]ReadResponse, error) {
	req := &multiRequest{
		Ops:        make([]multiRequestOp, 0, len(paths)),
		DoneHeader: multiHeader{Type: -1, Done: true, Err: -1},
	}
	for _, p := range paths {
		if err := validatePath(p, false); err != nil {
			return nil, err
		}
		req.Ops = append(req.Ops, multiRequestOp{multiHeader{opGetData, false, -1}, &getDataRequest{Path: p}})
	}
	res := &multiReadResponse{}
	if _, err := c.request(opMultiRead, req, res, nil); err != nil {
		return nil, err
	}
	if len(res.Ops) != len(paths) {
		return nil, ErrAPIError
	}
	return res.Ops, nil
}
