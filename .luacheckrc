-- luacheck (.ci/run) for the Redis engine's Lua, crates/eventbus-redis/src/**/*.lua:
-- Lua 5.1 as Redis embeds it, with the globals Redis gives a script.
std = "lua51"
read_globals = { "redis", "KEYS", "ARGV", "cjson", "cmsgpack", "bit", "struct" }
max_line_length = 140

-- A script is a body after the shared pieces it uses (crates/eventbus-redis/src/
-- durable/scripts.rs and history.rs put them together): each piece's functions are, to
-- the body, names it reads; to the piece, functions it only defines.
stds.prelude = {
  read_globals = {
    "varint", "meta", "fields", "append", "release_key", "hold", "keep_dead", "log_line", "id_less", "id_next",
    "entry_lines", "log_count", "log_trim", "log_packed", "log_write", "log_flush", "fail_one", "move_due", "next_due",
  },
}
stds.capture_one = { read_globals = { "capture" } }
stds.purge_one = { read_globals = { "purge" } }
stds.retain = { read_globals = { "kept", "history", "retain", "settle" } }

local durable = "crates/eventbus-redis/src/durable/lua/"
local history = "crates/eventbus-redis/src/history/"
for _, body in ipairs({ "ack", "fail", "requeue", "tick", "pending" }) do
  files[durable .. body .. ".lua"] = { std = "+prelude" }
end
files[durable .. "redrive.lua"] = { std = "+prelude+capture_one" }
files[durable .. "capture.lua"] = { std = "+capture_one" }
files[durable .. "publish.lua"] = { std = "+capture_one+retain" }
files[durable .. "delete.lua"] = { std = "+purge_one" }
files[durable .. "purge.lua"] = { std = "+purge_one" }
files[history .. "publish.lua"] = { std = "+retain" }
-- 211 unused function, 241 a table filled but never read: what a piece defines for
-- the bodies after it.
for _, piece in ipairs({ durable .. "prelude.lua", durable .. "capture_one.lua", durable .. "purge_one.lua",
  history .. "retain.lua" }) do
  files[piece] = { ignore = { "211", "241" } }
end
