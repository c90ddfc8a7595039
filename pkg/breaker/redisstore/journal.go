package redisstore

import (
	"context"
	"errors"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The fleet's journal (breaker.FleetJournal): one list, newest first,
// trimmed to FleetJournalLen in the same transaction that pushes, so that
// replica B's incident view shows the transitions replica A made. Entries
// are signed with the fleet key: a forged one would mislead an operator in
// an incident.

// ErrJournalUnreachable: Redis cannot be reached (or the store is degraded);
// the entry stays in the replica's own journal only.
var ErrJournalUnreachable = errors.New("redisstore: the fleet's journal is unreachable")

func (s *Store) journalKey() string { return s.prefix + "journal" }

// AppendJournal implements breaker.FleetJournal.
func (s *Store) AppendJournal(ctx context.Context, entries ...[]byte) error {
	if len(entries) == 0 {
		return nil
	}
	if s.sync.localIsTheStore() {
		return ErrJournalUnreachable
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// LPUSH pushes its values in order, each to the head: the newest
	// entry, given last, ends first.
	sealed := make([]any, len(entries))
	for i, e := range entries {
		sealed[i] = s.sign.sealIn("journal", e)
	}
	pipe := s.rdb.TxPipeline()
	pipe.LPush(ctx, s.journalKey(), sealed...)
	pipe.LTrim(ctx, s.journalKey(), 0, breaker.FleetJournalLen-1)
	if _, err := pipe.Exec(ctx); err != nil {
		s.count("journal")
		return errors.Join(ErrJournalUnreachable, err)
	}
	return nil
}

// RecentJournal implements breaker.FleetJournal. An entry without a valid
// signature (with a fleet key set) is left out and counted.
func (s *Store) RecentJournal(ctx context.Context, n int) ([][]byte, error) {
	if s.sync.localIsTheStore() {
		return nil, ErrJournalUnreachable
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	vals, err := s.rdb.LRange(ctx, s.journalKey(), 0, int64(min(n, breaker.FleetJournalLen))-1).Result()
	if err != nil {
		s.count("journal")
		return nil, errors.Join(ErrJournalUnreachable, err)
	}
	out := make([][]byte, 0, len(vals))
	for _, v := range vals {
		e, err := s.sign.openIn("journal", []byte(v))
		if err != nil {
			s.refused("journal_unsigned", "[store] a journal entry in Redis without a valid signature was left out (store.redis.hmac_key_file is set): something other than a fusebox replica of this fleet wrote it")
			continue
		}
		out = append(out, e)
	}
	return out, nil
}
