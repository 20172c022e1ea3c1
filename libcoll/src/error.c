/* error.c - text and names for every code libcoll returns. */
#include <errno.h>
#include <string.h>

#include "coll.h"

const char *coll_strerror(int code) {
  switch (code) {
#define COLL_ERR_TEXT_(name, value, text) \
  case COLL_##name:                       \
    return text;
    COLL_ERRNO_MAP(COLL_ERR_TEXT_)
#undef COLL_ERR_TEXT_
  case 0:
    return "success";
  default:
    break;
  }
  if (code < 0 && code > -4096) return strerror(-code);
  return "unknown error";
}

const char *coll_err_name(int code) {
  switch (code) {
#define COLL_ERR_NAME_(name, value, text) \
  case COLL_##name:                       \
    return #name;
    COLL_ERRNO_MAP(COLL_ERR_NAME_)
#undef COLL_ERR_NAME_
  case 0:
    return "OK";
  case -ETIMEDOUT:
    return "ETIMEDOUT";
  case -ENOMEM:
    return "ENOMEM";
  case -EINVAL:
    return "EINVAL";
  case -EPERM:
    return "EPERM";
  case -ENOSPC:
    return "ENOSPC";
  case -EADDRINUSE:
    return "EADDRINUSE";
  default:
    return "UNKNOWN";
  }
}
