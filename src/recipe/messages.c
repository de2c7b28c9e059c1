/* messages.c - Anthropic Messages request -> conversation (docs/RECIPE-RM.md).
 * Not implemented yet: every request is rejected with a clear message. */
#include <string.h>

#include "recipe/protocol_internal.h"

int rc_messages_convert(const json_t *body, rc_conversation *conv, rc_inference *inf, rc_api_error *e) {
    memset(conv, 0, sizeof *conv);
    memset(inf, 0, sizeof *inf);
    (void)body;
    return rc_pfail(e, "the messages API is not implemented yet");
}
