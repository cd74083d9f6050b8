-- Socle EventBus inbox, PostgreSQL 12+: the events each consumer has
-- processed, written by the `eventbus_client::inbox::Inbox` handler wrapper in the
-- handler's own transaction, so the side effect and this mark commit together and a
-- redelivered event is skipped and acked.
-- Idempotent: run it as often as you like.

create table if not exists eventbus_inbox (
    -- The durable consumer's name: one consumer's mark does not skip another's event.
    consumer      text        not null,
    -- The broker's event id (`Event.id`), the same on every redelivery.
    event_id      text        not null,
    -- When the handler's transaction committed; for pruning old marks, e.g.
    -- `delete from eventbus_inbox where processed_at < now() - interval '7 days'`
    -- (keep marks longer than any redelivery can take).
    processed_at  timestamptz not null default now(),
    primary key (consumer, event_id)
);
