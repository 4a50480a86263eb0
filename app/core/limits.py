"""The limits and defaults of jobq's values, wherever they are checked: the API's schemas, the SQS API, the
tables' CHECK constraints, token scopes' patterns.
"""

# Defaults of a queue nobody configured. They are the `queues` columns' server defaults, and the
# queries pass them where a queue row may not exist yet.
DEFAULT_VISIBILITY_TIMEOUT = 30.0  # seconds a lease lasts
DEFAULT_MAX_ATTEMPTS = 5  # leases before a failing job goes dead
DEFAULT_BACKOFF_BASE = 30.0  # seconds; retry n waits base * 2^(n-1), plus 0-30 % jitter
DEFAULT_BACKOFF_CAP = 3600.0  # seconds; no retry waits longer
DEFAULT_RETENTION = 86400.0  # seconds completed and cancelled jobs are kept before pruning

MAX_VISIBILITY_TIMEOUT = 43200.0  # 12 h: the longest lease or extension one call may ask for

# Queue names: 1-128 of these characters, wherever a name is checked (the API, the SQS API, the CHECK
# constraint of app/db/tables.py, token scopes' patterns).
QUEUE_NAME_CHARS = "A-Za-z0-9_.:-"
MAX_QUEUE_NAME = 128
QUEUE_NAME_PATTERN = rf"^[{QUEUE_NAME_CHARS}]{{1,{MAX_QUEUE_NAME}}}$"
# A job's key: any text of 1-256 characters (a tenant id, an email address, an SQS MessageGroupId).
MAX_KEY = 256
# W3C Trace Context (https://www.w3.org/TR/trace-context/): a traceparent as version 00 writes it, in
# lower case, and a tracestate of at most 512 characters (what the recommendation lets a vendor cut to).
TRACEPARENT_PATTERN = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
MAX_TRACESTATE = 512

# Job kinds (what a job is: send_email) are spelled as queue names are, wherever checked (the API, the
# CHECK constraint of app/db/tables.py).
KIND_PATTERN = QUEUE_NAME_PATTERN
MAX_KIND = MAX_QUEUE_NAME
# A job list's search (GET /jobs?q=, the dashboard's): at most this many characters, and no U+0000, which
# PostgreSQL's text cannot hold, so no key, error or payload has one to find (NO_NUL, for keys too).
MAX_SEARCH = 200
NO_NUL = r"^[^\x00]*$"
# Lease tokens are a UUID and the job's queue (app/service/rows.py); other spellings of one are accepted up
# to this many characters, and refused beyond (the API and the SQS API's receipt handles alike).
MAX_LEASE_TOKEN = 200
# Job ids stay below 2^53, so every JSON client (JavaScript's numbers included) reads them exactly.
MAX_JOB_ID = 2**53 - 1

# Dependencies (API part 6): a job waits for 1-1,000 parents; a lease carries its parents' results when it
# has at most MAX_LEASED_PARENTS of them (GET /jobs/{id}/parents pages them for any job).
MAX_PARENTS = 1000
MAX_LEASED_PARENTS = 100
