-- How long a grant lasts (see job_rate in sql/schema.sql). Short: a lowered limit waits this
-- long for the grants made before it, and a grant's unused starts stay counted for its period
-- and twice this. Long enough that a worker claiming every few milliseconds takes its turn once
-- in tens of claims.
CREATE OR REPLACE FUNCTION job_grant_span() RETURNS interval LANGUAGE sql IMMUTABLE
AS $$ SELECT interval '100 milliseconds' $$;
