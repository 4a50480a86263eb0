"""The SQS actions jobq answers, by name: the JSON protocol's ``X-Amz-Target: AmazonSQS.<Action>``, the
Query protocol's ``Action`` (app/sqs/router.py).

Each action takes the request's ``Context`` and its JSON body (a Query request's is decoded into the
same), and answers with the JSON body of SQS's answer, or raises ``SqsError``. They live by concept:
queues (app/sqs/queues.py), sending, receiving and what a receipt handle does (app/sqs/sending.py,
receiving.py, receipts.py), dead-letter redrive (app/sqs/redrive.py), tags and permissions
(app/sqs/tags.py), each on jobq's own operations in ``app.service``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from app.sqs import queues, receipts, receiving, redrive, sending, tags
from app.sqs.context import Context
from app.sqs.params import Body

Action = Callable[[Context, Body], Awaitable[Body]]

ACTIONS: dict[str, Action] = {
    "CreateQueue": queues.create_queue,
    "GetQueueUrl": queues.get_queue_url,
    "ListQueues": queues.list_queues,
    "DeleteQueue": queues.delete_queue,
    "PurgeQueue": queues.purge_queue,
    "GetQueueAttributes": queues.get_queue_attributes,
    "SetQueueAttributes": queues.set_queue_attributes,
    "ListDeadLetterSourceQueues": queues.list_dead_letter_source_queues,
    "TagQueue": tags.tag_queue,
    "UntagQueue": tags.untag_queue,
    "ListQueueTags": tags.list_queue_tags,
    "AddPermission": tags.add_permission,
    "RemovePermission": tags.remove_permission,
    "SendMessage": sending.send_message,
    "SendMessageBatch": sending.send_message_batch,
    "ReceiveMessage": receiving.receive_message,
    "DeleteMessage": receipts.delete_message,
    "DeleteMessageBatch": receipts.delete_message_batch,
    "ChangeMessageVisibility": receipts.change_message_visibility,
    "ChangeMessageVisibilityBatch": receipts.change_message_visibility_batch,
    "StartMessageMoveTask": redrive.start_message_move_task,
    "ListMessageMoveTasks": redrive.list_message_move_tasks,
}
