package broker_test

import (
	"testing"
	"time"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// Two brokers storing queues in segments of 50 messages: 8 producers and
// 16 consumers spread over both move 20,000 messages in each delivery
// mode across hundreds of rolls (what each message went through is
// checked as in TestTwoBrokersMoveMessages), and the drained segments are
// removed: the tail is all that is left.
func TestTwoBrokersMoveMessagesSegmented(t *testing.T) {
	root := zktest.Root(t)
	small := func(c *broker.Config) { c.SegmentSize = 50 }
	brokers := []*testBroker{newBroker(t, root, small), newBroker(t, root, small)}
	modes := []pb.DeliveryMode{pb.DeliveryMode_DELIVERY_MODE_AT_MOST_ONCE, pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE}
	if testing.Short() {
		modes = modes[1:]
	}
	conn := zktest.Conn(t)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			moveMessagesBy(t, brokers, mode, 8)
			items := root + "/queues/q-" + mode.String() + "/items"
			zktest.WaitFor(t, 30*time.Second, "drained segments removed", func() bool {
				children, _, err := conn.Children(items)
				return err == nil && len(children) == 1
			})
		})
	}
}
