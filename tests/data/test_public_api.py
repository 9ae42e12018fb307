"""segue.data's public surface: __all__ is sorted and every name exists."""

import segue.data


def test_all_is_sorted_and_importable() -> None:
    assert segue.data.__all__ == sorted(segue.data.__all__)
    for name in segue.data.__all__:
        assert hasattr(segue.data, name), name
