-- Socle EventBus transactional outbox, PostgreSQL 12+.
--
-- The application inserts a row in the same transaction as its own data; the relay
-- (`eventbus relay --database-url ...`) publishes each row once and marks it.
-- Idempotent: run it as often as you like (every migration, every deploy).

create table if not exists eventbus_outbox (
    -- Order of publication; the event's idempotency key is
    -- `outbox:<source>:<table>:<id>` (source: the database's system identifier, name and
    -- schema, or the relay's --source), so a relay that crashes after publishing and
    -- before marking duplicates nothing, and two databases' outboxes never collide.
    id            bigserial primary key,
    -- The channel to publish on (e.g. `orders.created`), checked by the broker.
    channel       text        not null,
    -- The event's body, as is.
    payload       bytea       not null,
    -- The event's metadata: a JSON object of string values, e.g. {"trace_id": "abc"}
    -- (a value of another type is sent as its JSON text).
    metadata      jsonb       not null default '{}',
    -- The payload's media type (e.g. `application/json`); empty = unspecified.
    content_type  text        not null default '',
    -- Events with one ordering key are published in id order, by one relay at a time
    -- (the relays take a per-key advisory lock when they claim), and delivered one at a
    -- time in that order; null = none.
    ordering_key  text,
    -- When the application wrote the row: the relay's lag is measured from it.
    created_at    timestamptz not null default now(),
    -- When the relay had the broker's OK; null = not published yet. Published rows are
    -- deleted after the relay's retention (`--retention-secs`; 0 keeps them).
    published_at  timestamptz
);

-- The relay's claim query (`where published_at is null order by id limit n for update
-- skip locked`) reads only this small index, however many published rows are kept.
create index if not exists eventbus_outbox_unpublished
    on eventbus_outbox (id) where published_at is null;

-- Wakes the relays at once (LISTEN eventbus_outbox); the payload names the table. The
-- notification is sent at commit, once per transaction per table (PostgreSQL folds
-- identical ones), so a large insert costs one notification.
create or replace function eventbus_outbox_notify() returns trigger
    language plpgsql as $$
begin
    perform pg_notify('eventbus_outbox', TG_TABLE_NAME);
    return null;
end;
$$;

drop trigger if exists eventbus_outbox_notify on eventbus_outbox;
create trigger eventbus_outbox_notify
    after insert on eventbus_outbox
    for each statement execute function eventbus_outbox_notify();
