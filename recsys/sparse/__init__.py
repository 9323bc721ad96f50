"""The embedding machinery: the sharding planner (which rank holds which table, slice or rows, and in
which memory tier), the lookups and table views every embedding layer shares, and the
hybrid-parallel layer on all-to-all."""
