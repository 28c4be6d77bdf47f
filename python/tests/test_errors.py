"""Error reasons have one table, the C++ one (shmtensor/errors.h), checked
against the proto's ErrorReason enum here as errors_test checks it in C++;
every reason the daemon can send has its own exception class."""

import shmtensor
from conftest import proto_enum
from shmtensor import _core, errors


def test_the_error_reason_table_is_the_protos():
    proto = {code: "ERROR_REASON_" + name
             for code, name in proto_enum("ErrorReason",
                                          "ERROR_REASON_").items()}
    assert dict(_core._error_reasons()) == proto


def test_every_reason_has_its_exception():
    """A reason added to the table and not here fails: its errors would
    come out as the code's generic class."""
    reasons = {name for code, name in _core._error_reasons() if code != 0}
    assert set(errors._BY_REASON) == reasons
    for name in reasons:
        e = errors.from_status(9, name, "m")  # FAILED_PRECONDITION's code.
        assert type(e) is errors._BY_REASON[name]
        assert isinstance(e, shmtensor.Error) and e.reason == name
