# qbroker: `make run` starts a local ZooKeeper and a broker; `make test` runs
# everything CI runs. Both install what is missing first (`make deps`).

GO       ?= go
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ZK_JAR   := /usr/share/java/zookeeper.jar
GOBIN    := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

.PHONY: all deps test faults run build generate python bench loadtest fmt vet clean pathfiles

all: build

# deps installs ZooKeeper (Debian's package, with a Java runtime) unless it
# or ZOOKEEPER_HOME is there, Python gRPC, and Chromium (the web console's
# browser test). Idempotent and quiet when nothing is missing.
deps:
	@if [ -n "$$ZOOKEEPER_HOME" ] || { [ -f $(ZK_JAR) ] && command -v java >/dev/null; }; then :; else \
		echo "installing ZooKeeper (apt-get install zookeeper)"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends zookeeper default-jre-headless >/dev/null; \
	fi
	@{ python3 -c 'import grpc' || /usr/bin/python3 -c 'import grpc'; } 2>/dev/null || { \
		echo "installing Python gRPC for clients/python (apt-get install python3-grpcio)"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends python3-grpcio python3-protobuf >/dev/null; }
	@command -v chromium >/dev/null || { \
		echo "installing Chromium for the web console's browser test (apt-get install chromium)"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
	@$(GO) mod download

VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/qbroker ./cmd/qbroker
	$(GO) build -o bin/loadtest ./loadtest

test: deps
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -race -timeout 20m ./...

# faults runs the fault and abuse suite at full length (faults/doc.go):
# brokers killed, paused and partitioned, ZooKeeper's leader killed and
# its quorum lost, abusive clients. It ends with the results table, also
# written to faults/results.md, and fails when a scenario misses the bar.
# (make test runs a short version.)
faults: deps
	$(GO) test -count=1 -timeout 30m -v -run . ./faults -args -faults.full -faults.out results.md

run: deps
	$(GO) run ./cmd/qbroker dev

bench: deps
	$(GO) test -run '^$$' -bench . -benchmem ./zkqueue

# pathfiles lists the hand-written files a plain publish, a consume, an
# ack and a lease expiry run code in, measured with coverage counters
# cleared before and written after each call (internal/pathfiles). It
# fails when one of them runs code of an optional feature's file.
pathfiles: deps
	$(GO) build -cover -covermode=atomic -coverpkg=github.com/qbroker/qbroker/... \
		-o bin/pathfiles ./internal/pathfiles
	d=$$(mktemp -d) && GOCOVERDIR=$$d ./bin/pathfiles; s=$$?; rm -rf $$d; exit $$s

loadtest: deps build
	./bin/loadtest --spawn-brokers 1

# generate rebuilds api/queuepb from api/queue.proto and api/coord.proto
# (committed; only needed after editing a .proto).
generate:
	@command -v protoc >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq protobuf-compiler >/dev/null; }
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	protoc --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		api/queue.proto api/coord.proto
	mkdir -p api/queuepb && mv api/queue.pb.go api/queue_grpc.pb.go api/coord.pb.go api/coord_grpc.pb.go api/queuepb/

# python rebuilds the Python client's stubs clients/python/queue_pb2.py and
# queue_pb2_grpc.py from api/queue.proto (committed; only needed after
# editing it) with Debian's protoc and gRPC Python plugin, and installs the
# runtime the example needs (deps).
GRPC_PY_PLUGIN := /usr/bin/grpc_python_plugin
python: deps
	@{ command -v protoc >/dev/null && [ -x $(GRPC_PY_PLUGIN) ]; } || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends protobuf-compiler protobuf-compiler-grpc >/dev/null; }
	protoc -Iapi --python_out=clients/python \
		--plugin=protoc-gen-grpc_python=$(GRPC_PY_PLUGIN) --grpc_python_out=clients/python \
		api/queue.proto

clean:
	rm -rf bin
