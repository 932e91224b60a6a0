package lockdelay_test

import (
	"testing"

	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) { zktest.Main(m) }
