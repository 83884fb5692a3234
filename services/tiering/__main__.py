from services.tiering.main import main

main()
