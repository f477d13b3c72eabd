"""MovieLens layouts users have (ml-latest / ML-20M ratings.csv, ML-1M ratings.dat, directories) and dense ids."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.data.item_ids import ItemIdMap, table_size_warning
from tfdp_embed.data.movielens import MovieLensFormatError, load_movielens_data, read_ratings

# ml-latest style: header, commas, half stars, CRLF, sparse movie ids (163949 is ml-latest's largest).
CSV = "userId,movieId,rating,timestamp\r\n1,163949,3.5,300\r\n1,2,0.5,100\r\n2,163949,5.0,50\r\n2,296,4.5,60\r\n"


def _write(path, text):
    path.write_text(text, newline="")
    return str(path)


def test_ratings_csv_with_header_crlf_and_half_stars(tmp_path):
    ratings = read_ratings(_write(tmp_path / "ratings.csv", CSV))
    assert ratings.users.tolist() == [1, 1, 2, 2]
    assert ratings.items.tolist() == [163949, 2, 163949, 296]
    assert ratings.ratings.tolist() == [3.5, 0.5, 5.0, 4.5]
    assert ratings.timestamps.tolist() == [300, 100, 50, 60]


def test_dense_ids_from_the_ratings_and_timelines_in_dense_ids(tmp_path):
    _write(tmp_path / "ratings.csv", CSV)
    data = load_movielens_data(str(tmp_path), context_length=2, test_fraction=0.5, split_seed=0)
    # distinct ids 2, 296, 163949 -> dense 1, 2, 3: a 4-row table, not 163,950 rows
    assert data.num_items == 3 and data.rated_items == 3
    assert data.item_ids.ids.tolist() == [2, 296, 163949]
    timelines = {**data.train_timelines, **data.test_timelines}
    assert timelines[1].tolist() == [1, 3]  # user 1: movie 2 (t=100), then 163949 (t=300)
    assert timelines[2].tolist() == [3, 2]  # user 2: 163949 (t=50), then 296 (t=60)
    assert data.summary()["item_ids"]["largest_original_id"] == 163949


def test_catalogue_beside_the_ratings_numbers_items(tmp_path):
    _write(tmp_path / "ratings.csv", CSV)
    # movies.csv lists a movie nobody rated (7) and titles with commas (quoted, as GroupLens writes them)
    _write(
        tmp_path / "movies.csv",
        'movieId,title,genres\r\n2,"Jumanji, the movie (1995)",Adventure\r\n7,X (1995),Drama\r\n'
        '296,Pulp Fiction (1994),Crime\r\n163949,"The Beast, Part 2 (2016)",(no genres listed)\r\n',
    )
    data = load_movielens_data(str(tmp_path / "ratings.csv"), context_length=2, test_fraction=0.5)
    assert data.item_ids.ids.tolist() == [2, 7, 296, 163949] and data.item_ids.source.startswith("catalogue")
    assert data.num_items == 4 and data.rated_items == 3
    ignored = load_movielens_data(str(tmp_path / "ratings.csv"), context_length=2, test_fraction=0.5, catalogue=None)
    assert ignored.num_items == 3
    # a rated movie the catalogue lacks is refused with file, line and field
    _write(tmp_path / "movies.csv", "movieId,title,genres\n2,A,B\n163949,C,D\n")
    with pytest.raises(MovieLensFormatError, match=r"ratings.csv:5: field 'item' 296 is not a movie of the catalogue"):
        load_movielens_data(str(tmp_path), context_length=2, test_fraction=0.5)


def test_u_data_and_ratings_dat_layouts_and_directories(tmp_path):
    (tmp_path / "ml-100k").mkdir()
    _write(tmp_path / "ml-100k" / "u.data", "1\t5\t3\t10\n1\t6\t4\t20\n2\t5\t1\t5\n2\t6\t1\t6\n")
    _write(tmp_path / "ml-100k" / "u.item", "5|Movie five|01-Jan-1995\n6|Movie six|01-Jan-1995\n9|nine|x\n")
    data = load_movielens_data(str(tmp_path / "ml-100k"), context_length=2, test_fraction=0.5)
    assert data.path.endswith("u.data") and data.item_ids.ids.tolist() == [5, 6, 9]
    (tmp_path / "ml-1m").mkdir()
    _write(tmp_path / "ml-1m" / "ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n")
    ratings = read_ratings(str(tmp_path / "ml-1m"))
    assert ratings.items.tolist() == [1193, 661] and ratings.ratings.tolist() == [5.0, 3.0]
    with pytest.raises(FileNotFoundError, match="holds none of ratings.csv, ratings.dat, u.data"):
        read_ratings(str(tmp_path))


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "userId,movieId,rating,timestamp\n1,2,3.5,10\n1,2,four,11\n",
            r"ratings.csv:3: field 'rating' must be a number",
        ),
        ("userId,movieId,rating,timestamp\n1,2,3.5\n", r"ratings.csv:2: expected 4 comma-separated fields"),
        (
            "userId,itemId,rating,timestamp\n1,2,3.5,10\n",
            r"ratings.csv:1: field 'user' must be an integer.*only header",
        ),
        ("1,2.5,3,10\n", r"ratings.csv:1: field 'item' must be an integer; found '2.5'"),
        ("1,2,3,10\n1 2 3 10\n", r"ratings.csv:2: expected 4 comma-separated fields"),
        ("userId,movieId,rating,timestamp\n", r"no ratings \(the file is empty or holds only a header\)"),
        ("1 2 3 10\n", r"ratings.csv:1: not a MovieLens ratings line"),
    ],
)
def test_malformed_files_are_refused_with_file_line_and_field(tmp_path, text, message):
    with pytest.raises(MovieLensFormatError, match=message):
        read_ratings(_write(tmp_path / "ratings.csv", text))


def test_item_id_map_round_trip_and_unknown_fallback():
    ids = ItemIdMap.from_ids([10, 163949, 10, 3], source="test")
    assert ids.to_dense([3, 10, 163949, 7, 0, -1]).tolist() == [1, 2, 3, 0, 0, 0]
    assert ids.to_original([1, 2, 3]).tolist() == [3, 10, 163949]
    assert not ids.is_identity and ItemIdMap(np.arange(1, 5)).is_identity
    with pytest.raises(ValueError, match=r"Dense item ids must lie in \[1, 3\]"):
        ids.to_original([4])
    with pytest.raises(ValueError, match="strictly increasing"):
        ItemIdMap(np.array([0, 1]))


def test_table_size_warning_fires_only_for_a_mostly_empty_table():
    assert table_size_warning(table_rows=31, distinct_ids=30, what="item") is None
    message = table_size_warning(table_rows=163950, distinct_ids=30, what="item")
    assert "163950 rows for 30 distinct ids" in message and "densely" in message
