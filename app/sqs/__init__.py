"""Amazon SQS compatibility: the SQS API (AWS JSON 1.0) over jobq's own jobs and queues."""
