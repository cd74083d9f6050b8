-- Deletes a consumer's keys on a cluster, in its own slot (see init.lua): KEYS stream
-- (it routes the script); ARGV key base. Returns 1.
purge(ARGV[1])
return 1
