-- A consumer's keys on a cluster, in its own slot (see purge.lua for their deletion):
-- KEYS stream, log format; ARGV group. Makes its stream and group and says its log may
-- be packed (a cluster has no instance of a release that reads one line per entry
-- only). Returns 1.
redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
redis.call('SET', KEYS[2], '2')
return 1
