package redisstore

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/redis/go-redis/v9"
)

// recJob is one queued script call of Record (or of the release an off
// breaker still owes).
type recJob struct {
	e    *entry
	op   string
	now  int64
	adm  breaker.Admission
	res  breaker.Result
	args args
	// local: the outcome is already on the local view (own evidence
	// first), so a failed call must not record it there again.
	local bool
	// tok is the outcome's token among the breaker's pending ones
	// (inflight.go); 0 for a record that was never pending.
	tok uint64
	out breaker.Outcome // the outcome as the policy judged it
}

// recordWorkers run queued records; a breaker always goes to the same one,
// so its outcomes reach Redis in the order they were recorded.
const recordWorkers = 4

func (s *Store) enqueue(ctx context.Context, e *entry, j recJob) {
	j.e = e
	h := fnv.New32a()
	_, _ = h.Write([]byte(e.key))
	i := h.Sum32() % uint32(len(s.rec))
	o := &s.over[i]
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.jobs) == 0 {
		select {
		case s.rec[i] <- j:
			return
		default:
		}
	}
	// The queue is full (Redis far slower than the traffic): the job waits
	// in the worker's overflow, behind the queue, so that a breaker's
	// outcomes still reach Redis in order; none is dropped before
	// maxOverflow.
	if len(o.jobs) >= maxOverflow {
		s.count("record_queue_full")
		s.jobLocal(ctx, e, j)
		return
	}
	o.jobs = append(o.jobs, j)
}

// overflow is a record worker's jobs past its full queue.
type overflow struct {
	mu   sync.Mutex
	jobs []recJob
}

// maxOverflow bounds one worker's overflow (about 200 MB at worst).
const maxOverflow = 1 << 20

// takeOverflow moves up to maxBatch-len(batch) overflow jobs into batch.
func (s *Store) takeOverflow(i int, batch []recJob) []recJob {
	o := &s.over[i]
	o.mu.Lock()
	defer o.mu.Unlock()
	n := min(maxBatch-len(batch), len(o.jobs))
	batch = append(batch, o.jobs[:n]...)
	o.jobs = dropRange(o.jobs, 0, n)
	return batch
}

// maxBatch bounds the records one worker sends in one round trip.
const maxBatch = 256

// recordLoop runs queued records in batches: whatever is queued when the
// worker comes round (up to maxBatch) goes to Redis in one pipelined round
// trip, so the records a worker writes per second grow with the queue, not
// with 1/RTT. Before, each outcome cost its own round trip and a slow Redis
// (2 ms per direction) lost most of a burst to the full queue.
func (s *Store) recordLoop(ctx context.Context, i int) {
	ch := s.rec[i]
	batch := make([]recJob, 0, maxBatch)
	for {
		batch = s.fill(i, batch[:0])
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				s.drain(i)
				return
			case j := <-ch:
				batch = s.fill(i, append(batch, j))
			}
		}
		s.runBatch(batch)
		// The batch's array is reused: its slots must not keep the jobs
		// just run (their breakers, keys and call arguments) alive while
		// the worker idles. Before, after a config reload the last batch
		// kept the replaced breakers alive with every outcome they still
		// owed Redis: the fleet soak's memory check saw owe and recordJob
		// grow while every backlog read 0 (#49).
		clear(batch)
	}
}

// fill adds to batch what is queued, oldest first: the queue, then the
// overflow behind it.
func (s *Store) fill(i int, batch []recJob) []recJob {
	ch := s.rec[i]
	for len(batch) < maxBatch {
		select {
		case j := <-ch:
			batch = append(batch, j)
			continue
		default:
		}
		break
	}
	if len(batch) < maxBatch {
		batch = s.takeOverflow(i, batch)
	}
	return batch
}

// runBatch runs queued records and releases in one pipeline. Each answer is
// settled as a single call's would be; a job whose call failed (or whose
// breaker is on local state) is recorded on the local view.
func (s *Store) runBatch(batch []recJob) {
	if len(batch) == 1 {
		_, _ = s.runJob(context.Background(), batch[0].e, batch[0])
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, j := range batch {
		if !s.remote(j.e) {
			continue
		}
		cmds[i] = script.EvalSha(ctx, pipe, scriptKeys(j.e, j.args), s.scriptArgs(j.e, j.op, j.now, j.args)...)
	}
	_, _ = pipe.Exec(ctx)
	for i, j := range batch {
		if cmds[i] == nil {
			s.jobLocal(ctx, j.e, j)
			continue
		}
		vals, err := cmds[i].Slice()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			// The script is not loaded (Redis restarted): this job loads
			// it on its own; the next batch finds it.
			_, _ = s.runJob(context.Background(), j.e, j)
			continue
		}
		var r *result
		if err == nil {
			r, err = parseReply(vals)
		} else {
			err = fmt.Errorf("redisstore %s %s: %w", j.op, j.e.id.Route, err)
		}
		j.e.emitMu.Lock()
		j.e.lastNow.Store(j.now)
		_, err = s.settle(j.e, j.op, j.now, r, err, j.answer())
		j.e.emitMu.Unlock()
		if err != nil {
			s.jobLocal(ctx, j.e, j)
		}
	}
}

// drainFor bounds how long the record workers write what is still queued
// when the store stops: inside fusebox's own shutdown, after gRPC drained.
const drainFor = 5 * time.Second

// drain writes the records still queued at shutdown (R-ST8: nothing queued
// is dropped because the process ends), each call bounded by the op
// timeout, all of them by drainFor.
func (s *Store) drain(i int) {
	deadline := time.Now().Add(drainFor)
	for time.Now().Before(deadline) {
		batch := s.fill(i, nil)
		if len(batch) == 0 {
			return
		}
		s.runBatch(batch)
		// The batch's array is reused: its slots must not keep the jobs
		// just run (their breakers, keys and call arguments) alive while
		// the worker idles. Before, after a config reload the last batch
		// kept the replaced breakers alive with every outcome they still
		// owed Redis: the fleet soak's memory check saw owe and recordJob
		// grow while every backlog read 0 (#49).
		clear(batch)
	}
}
