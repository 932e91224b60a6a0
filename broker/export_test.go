package broker

import "context"

// RemoveQueueAt runs the second step of a deletion as a deleter that marked
// the queue at version would.
func (b *Broker) RemoveQueueAt(ctx context.Context, name string, version int32) error {
	return b.removeQueue(ctx, name, version)
}
